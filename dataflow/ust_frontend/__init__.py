"""UST frontend: the Universal Sparse Tensor format language, tensors and their conversions."""

from .errors import FormatError
from .format import TensorFormat
from .levels import BinOp, Const, Dim, LevelFormat, LevelSpec, LevelType
from .named import NamedFormats
from .ops import Elementwise, Matmul, Sddmm, add, matmul, multiply, sddmm
from .plan import Plan, PlanMismatchError
from .storage import LayoutError
from .tensor import Tensor

__all__ = [
    "BinOp",
    "Const",
    "Dim",
    "Elementwise",
    "FormatError",
    "LayoutError",
    "LevelFormat",
    "LevelSpec",
    "LevelType",
    "Matmul",
    "NamedFormats",
    "Plan",
    "PlanMismatchError",
    "Sddmm",
    "Tensor",
    "TensorFormat",
    "add",
    "matmul",
    "multiply",
    "sddmm",
]
