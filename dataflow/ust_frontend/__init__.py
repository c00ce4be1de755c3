"""UST frontend: the Universal Sparse Tensor format language, tensors and their conversions."""

from .errors import FormatError
from .format import TensorFormat
from .levels import BinOp, Const, Dim, LevelFormat, LevelSpec, LevelType
from .named import NamedFormats
from .storage import LayoutError
from .tensor import Tensor

__all__ = [
    "BinOp",
    "Const",
    "Dim",
    "FormatError",
    "LayoutError",
    "LevelFormat",
    "LevelSpec",
    "LevelType",
    "NamedFormats",
    "Tensor",
    "TensorFormat",
]
