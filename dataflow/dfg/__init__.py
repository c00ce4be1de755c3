"""DFG: `Program` = DAG of `Kernel`s; `Kernel` = loop-body DFG + iteration domain + streams.

`import dataflow.dfg` imports none of its modules: each name below is imported from its module
the first time it is used, so `dataflow.dfg.ops` (the op table the arch validator reads) costs
no numpy (start-up, issue 14; docs/conventions.md#timing-only).
"""

import importlib

#: name -> the module it comes from
_EXPORTS = {
    "Addr": "dataflow.dfg.graph", "Buffer": "dataflow.dfg.graph",
    "DFGError": "dataflow.dfg.graph", "Kernel": "dataflow.dfg.graph",
    "Loop": "dataflow.dfg.graph", "Node": "dataflow.dfg.graph",
    "Program": "dataflow.dfg.graph", "Op": "dataflow.dfg.ops",
}
__all__ = ["Addr", "Buffer", "DFGError", "Kernel", "Loop", "Node", "Op", "Program"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dataflow.dfg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next use finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
