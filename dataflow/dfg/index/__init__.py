"""The generic lowering: index notation plus level formats -> `Kernel`
(docs/architecture.md#the-generic-lowering). `notation.py` parses `C[i,j] += A[i,k] * B[k,j]`;
`tensors.py` describes a tensor's levels (dense, range, compressed, singleton); `coords.py`
walks the driving tensor's levels into loops and addresses the others; `merge.py` co-iterates
element-wise statements; `lower.py` builds the kernel; `program.py` the program with its
inputs."""

from dataflow.dfg.index.lower import AUTO, CONCORDANT, IndexLowering, index_kernel, lower_index
from dataflow.dfg.index.notation import parse_statement
from dataflow.dfg.index.program import index_program
from dataflow.dfg.index.tensors import Level, LevelExpr, LevelKind, TensorLevels, csr, dense

__all__ = ["AUTO", "CONCORDANT", "IndexLowering", "Level", "LevelExpr", "LevelKind",
           "TensorLevels", "csr", "dense", "index_kernel", "index_program", "lower_index",
           "parse_statement"]
