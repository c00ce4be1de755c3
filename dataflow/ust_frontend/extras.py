"""Optional packages: `require(module, extra)` imports one or says which extra installs it.

The core install has neither numba-cuda, torch, optuna, Dask nor pyarrow; code that needs one
calls `require` where it is used, so a missing package is one line naming the extra and the pip
command instead of a `ModuleNotFoundError` from deep inside. (It lives in the frontend, the
lowest layer that uses an optional package, because it raises a `UserError`: a leaf module may
not import `dataflow.errors`.)
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from dataflow.errors import UserError

#: extra -> what it installs (pyproject.toml's optional-dependencies)
EXTRAS = {"cuda": "numba-cuda", "torch": "torch", "dse": "optuna, Dask and pyarrow",
          "dask": "Dask (distributed)"}


class MissingExtraError(UserError):
    """An optional package is not installed; the message names the extra that installs it."""


def require(module: str, extra: str, *, needed_for: str | None = None) -> ModuleType:
    """`importlib.import_module(module)`, or `MissingExtraError` naming `extra` and the pip
    command (`needed_for` says what wanted it, e.g. "backend='cuda'")."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; pyproject.toml has {sorted(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        who = f"{needed_for} needs" if needed_for else "this needs"
        raise MissingExtraError(
            f"{who} {module}, which is not installed ({exc}); install the {extra!r} extra "
            f"({EXTRAS[extra]}): pip install -e \".[{extra}]\"") from exc


def warn_if_grad(op: str, *operands) -> None:
    """A `UserWarning` when a torch operand of `op` requires grad: the numpy, sim and cuda
    backends compute on detached copies, so the output has no `grad_fn`."""
    if any(getattr(x, "requires_grad", False) for x in operands):
        warnings.warn(f"{op}: a torch operand has requires_grad=True, but gradients do not flow "
                      "through the simulated backends (numpy, sim, cuda): the output has no "
                      "grad_fn; detach the operand, or compute gradients with torch itself",
                      UserWarning, stacklevel=3)
