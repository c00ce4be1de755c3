"""UST frontend: the Universal Sparse Tensor format language, tensors and their conversions."""

from .errors import FormatError
from .format import Dimension, TensorFormat
from .levels import (
    BinOp,
    Const,
    Dim,
    DimSlice,
    LevelFormat,
    LevelProperty,
    LevelSpec,
    LevelType,
    Sym,
)
from .named import NamedFormats
from .ops import Elementwise, Matmul, Sddmm, add, matmul, multiply, sddmm
from .plan import Plan, PlanMismatchError
from .storage import LayoutError
from .tensor import Tensor

__all__ = [
    "BinOp",
    "Const",
    "Dim",
    "DimSlice",
    "Dimension",
    "Elementwise",
    "FormatError",
    "LayoutError",
    "LevelFormat",
    "LevelProperty",
    "LevelSpec",
    "LevelType",
    "Matmul",
    "NamedFormats",
    "Plan",
    "PlanMismatchError",
    "Sddmm",
    "Sym",
    "Tensor",
    "TensorFormat",
    "add",
    "matmul",
    "multiply",
    "sddmm",
]
