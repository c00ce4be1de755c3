"""UST frontend: the Universal Sparse Tensor format language, tensors and their conversions.

The names below are imported from their modules when first used (`_EXPORTS`): a command that
needs the tensor and the matmul lowering does not wait for the other ops (start-up, issue 14).
"""

from dataflow.lazy_exports import lazy_exports

#: name -> the module it comes from
_EXPORTS = {
    "FormatError": "dataflow.ust_frontend.errors",
    "Dimension": "dataflow.ust_frontend.format",
    "TensorFormat": "dataflow.ust_frontend.format",
    "BinOp": "dataflow.ust_frontend.levels",
    "Const": "dataflow.ust_frontend.levels",
    "Dim": "dataflow.ust_frontend.levels",
    "DimSlice": "dataflow.ust_frontend.levels",
    "LevelFormat": "dataflow.ust_frontend.levels",
    "LevelProperty": "dataflow.ust_frontend.levels",
    "LevelSpec": "dataflow.ust_frontend.levels",
    "LevelType": "dataflow.ust_frontend.levels",
    "Sym": "dataflow.ust_frontend.levels",
    "NamedFormats": "dataflow.ust_frontend.named",
    "Elementwise": "dataflow.ust_frontend.ops",
    "Matmul": "dataflow.ust_frontend.ops",
    "Sddmm": "dataflow.ust_frontend.ops",
    "add": "dataflow.ust_frontend.ops",
    "matmul": "dataflow.ust_frontend.ops",
    "multiply": "dataflow.ust_frontend.ops",
    "sddmm": "dataflow.ust_frontend.ops",
    "Plan": "dataflow.ust_frontend.plan",
    "PlanMismatchError": "dataflow.ust_frontend.plan",
    "LayoutError": "dataflow.ust_frontend.storage",
    "Tensor": "dataflow.ust_frontend.tensor",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
