"""Names a package exports, each imported from its module the first time it is used, so that
importing the package costs none of its modules (start-up, issue 14;
docs/conventions.md#timing-only). A leaf: it imports nothing from `dataflow`."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, namespace: dict, exports: dict[str, str]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package` (whose globals are
    `namespace`) exporting `exports`: name -> the module it comes from. A name once fetched is
    kept in the namespace, so the next use does not come here."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
