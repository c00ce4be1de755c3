"""A `Program` from index notation: the generic kernel (`lower.lower_index`) with its inputs laid
out the way the kernel reads them (a located tensor padded with zeros where its coordinates run
past the edges, a merge's position maps and zero slots)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dataflow.dfg.graph import BufferRole, DFGError, Program
from dataflow.dfg.index.lower import AUTO, IndexLowering, lower_index
from dataflow.dfg.index.merge import merge_inputs
from dataflow.dfg.index.notation import Combine
from dataflow.dfg.index.tensors import TensorLevels
from dataflow.dfg.ops import Op


def _padded(t: TensorLevels, pad: tuple[int, ...], dtype) -> np.ndarray:
    """`t`'s values (in level order) with `pad[d]` zeros on both sides of dimension d."""
    data = np.asarray(t.val, dtype=dtype).reshape([lv.size for lv in t.levels])
    widths = [(0, 0) if lv.expr.op else (pad[lv.expr.dim],) * 2 for lv in t.levels]
    return np.pad(data, widths).ravel()


def _input(low: IndexLowering, tensors: Mapping[str, TensorLevels], buffer: str, dtype):
    tensor, role = dict(low.sources)[buffer]
    t = tensors[tensor]
    if role != "val":
        return t.level_crd(int(role[3:]))
    if t.val is None:
        raise DFGError(f"tensor {tensor!r} has no values")
    pads = dict(low.pads)
    if tensor in pads:
        return _padded(t, pads[tensor], dtype)
    return np.ascontiguousarray(t.val, dtype=dtype).ravel()


def _merge_program_inputs(low: IndexLowering, tensors, dtype) -> list:
    """A merge's inputs: values (with zero slots), position maps, and S's crd when used."""
    names = [f.tensor for f in low.statement.factors]
    if any(tensors[n].val is None for n in names):
        raise DFGError(f"{low.statement}: an operand has no values")
    inputs = merge_inputs(low.coiteration, tuple(tensors[n].val for n in names), dtype,
                          tuple(tensors[n].buffer or n for n in names))
    if "S_crd" in low.kernel.buffer_map:
        inputs.append(("S_crd", low.coiteration.crd))
    return inputs


def index_program(statement, tensors: Mapping[str, TensorLevels],
                  order: Sequence[str] | None = None, vector: str | None = AUTO,
                  name: str = "index", dtype=np.float32, macs: int | None = None,
                  coiteration=None, program_name: str | None = None) -> Program:
    """The one-kernel program of `statement` over `tensors` (their values as its inputs).
    The output is the output tensor's buffer: its shape when dense, (stored,) when sparse.
    `macs`: the useful multiply-accumulates (default: the loop nest's elements times its
    multiplies; give the true count when a format stores filler, a diagonal's or a block's
    zeros). `name` names the kernel, `program_name` (default `name`) the program."""
    low = lower_index(statement, tensors, order, vector, name, coiteration)
    kern = low.kernel
    if low.coiteration is not None:
        inputs = _merge_program_inputs(low, tensors, dtype)
    else:
        inputs = [(b.name, _input(low, tensors, b.name, dtype)) for b in kern.buffers
                  if b.role == BufferRole.INPUT]
    (out,) = [b for b in kern.buffers if b.role == BufferRole.OUTPUT]
    out_t = tensors.get(low.statement.output.tensor)
    dense_out = out_t is None or not out_t.sparse
    shape = tuple(out_t.shape) if out_t is not None and dense_out else \
        (tuple(int(n) for n in _out_shape(low, tensors)) if dense_out else (out.size,))
    if macs is None:
        muls = sum(n.op is Op.MUL for n in kern.nodes)
        macs = low.iterations * muls if low.statement.combine is Combine.PRODUCT else 0
    prog = Program(name=program_name or name, kernels=(kern,), inputs=tuple(inputs),
                   outputs=((out.name, shape),), dtype=np.dtype(dtype).name, macs=int(macs))
    prog.verify()
    return prog


def _out_shape(low: IndexLowering, tensors) -> tuple[int, ...]:
    ext = {}
    for f in low.statement.factors:
        for v, n in zip(f.indices, tensors[f.tensor].shape):
            ext.setdefault(v, n)
    return tuple(ext[v] for v in low.statement.output.indices)
