"""DFG: `Program` = DAG of `Kernel`s; `Kernel` = loop-body DFG + iteration domain + streams.

`import dataflow.dfg` imports none of its modules: each name below is imported from its module
the first time it is used, so `dataflow.dfg.ops` (the op table the arch validator reads) costs
no numpy (start-up, issue 14; docs/conventions.md#timing-only).
"""

from dataflow.lazy_exports import lazy_exports

#: name -> the module it comes from
_EXPORTS = {
    "Addr": "dataflow.dfg.graph", "Buffer": "dataflow.dfg.graph",
    "DFGError": "dataflow.dfg.graph", "Kernel": "dataflow.dfg.graph",
    "Loop": "dataflow.dfg.graph", "Node": "dataflow.dfg.graph",
    "Program": "dataflow.dfg.graph", "Op": "dataflow.dfg.ops",
}
__all__ = ["Addr", "Buffer", "DFGError", "Kernel", "Loop", "Node", "Op", "Program"]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
