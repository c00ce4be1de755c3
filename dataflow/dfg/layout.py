"""Data-layout passes over a `Program`: a buffer stored in another order, with every access of
every kernel rewritten to match and the host-side data permuted the same way, so values are
unchanged (docs/conventions.md#register-blocking). The planning stage chooses them with the
kernel passes of `dataflow.dfg.transform`; this module knows no architecture.

- `pack_panels`: panels of `panel` rows stored column by column (BLIS's packed A), so `panel`
  rows of one column are consecutive words: one SPM row;
- `pack_column_panels`: the same for panels of columns (a transposed operand's packing);
- `pad_rows`: an input stored with a row pitch of cols + pad words, so a column stream moves
  across the SPM lines;
- `pitch_output_rows`: the same for an output, its pad words dropped when it is read back.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.dfg.graph import Addr, DFGError, Program
from dataflow.dfg.ops import Op


def _split_address(addr: Addr, cols: int, where: str) -> tuple[dict, int, dict, int]:
    """(row terms, row const, column terms, column const) of `addr` = row * cols + col."""
    row, col = {}, {}
    for v, c in addr.terms:
        if c % cols == 0:
            row[v] = row.get(v, 0) + c // cols
        elif abs(c) < cols:
            col[v] = col.get(v, 0) + c
        else:
            raise DFGError(f"{where}: coefficient {c} of {v!r} mixes rows and columns")
    rconst, cconst = divmod(addr.const, cols)
    return row, rconst, col, cconst


def _relayout(program: Program, buffer: str, rewrite, data: np.ndarray,
              size: int | None = None) -> Program:
    """`program` with every access to input `buffer` replaced by `rewrite(kernel, node)` (a
    node) and the buffer's data by `data` (flat, in the new layout); `size` its new word
    count when the layout pads."""
    kernels = []
    for k in program.kernels:
        nodes = tuple(rewrite(k, n) if n.buffer == buffer else n for n in k.nodes)
        buffers = k.buffers if size is None else tuple(
            dataclasses.replace(b, size=size) if b.name == buffer else b for b in k.buffers)
        kernels.append(dataclasses.replace(k, nodes=nodes, buffers=buffers))
    inputs = tuple((name, data if name == buffer else x) for name, x in program.inputs)
    return dataclasses.replace(program, kernels=tuple(kernels), inputs=inputs)


def _terms(terms: dict) -> tuple:
    return tuple((v, c) for v, c in terms.items() if c)


def pack_panels(program: Program, buffer: str, rows: int, cols: int, panel: int) -> Program:
    """Store input `buffer` (rows x cols, row-major) as panels of `panel` rows, each panel
    column by column: element (r, c) at (r // panel) * panel * cols + c * panel + r % panel.
    Every access to it in every kernel is rewritten (row coefficients must be multiples of
    `panel`), and the input data is permuted the same way (the DMA writes it so)."""
    where = f"program {program.name!r}: pack_panels({buffer!r}, panel {panel})"
    if rows % panel:
        raise DFGError(f"{where}: {rows} rows are not a multiple of the panel")

    def rewrite(k, n):
        if n.addr.index_stride or n.addr.span or (k.vector_var and n.addr.coef(k.vector_var)):
            raise DFGError(f"{where}: node %{n.id} is not a scalar affine access")
        row, rconst, col, cconst = _split_address(n.addr, cols, where)
        if any(c % panel for c in row.values()):
            raise DFGError(f"{where}: node %{n.id}'s row steps are not whole panels")
        terms = {v: c // panel * panel * cols for v, c in row.items()}
        for v, c in col.items():
            terms[v] = terms.get(v, 0) + c * panel
        const = rconst // panel * panel * cols + cconst * panel + rconst % panel
        return dataclasses.replace(n, addr=Addr(_terms(terms), const))

    data = program.input_map[buffer].reshape(rows // panel, panel, cols)
    return _relayout(program, buffer, rewrite,
                     np.ascontiguousarray(data.transpose(0, 2, 1)).ravel())


def pack_column_panels(program: Program, buffer: str, rows: int, cols: int,
                       panel: int) -> Program:
    """Store input `buffer` (rows x cols, row-major) as panels of `panel` columns, each panel
    row by row (BLIS's packed B): element (r, c) at (c // panel) * panel * rows + r * panel +
    c % panel. Its vector accesses (lanes along the columns: the kernel's vector loop, stepping
    by `panel`) become row loads of `panel` consecutive words (`Addr.span`), so a walk down the
    rows of one panel moves through the SPM lines instead of staying on one."""
    where = f"program {program.name!r}: pack_column_panels({buffer!r}, panel {panel})"
    if cols % panel:
        raise DFGError(f"{where}: {cols} columns are not a multiple of the panel")

    def rewrite(k, n):
        vv = k.vector_var
        row, rconst, col, cconst = _split_address(n.addr, cols, where)
        if n.op is not Op.LOAD or n.addr.index_stride or n.addr.span or \
                col != {vv: 1} or cconst % panel:
            raise DFGError(f"{where}: node %{n.id} is not a vector load along the columns")
        terms = {v: c * panel for v, c in row.items()}
        terms[vv] = terms.get(vv, 0) + rows  # the vector loop steps whole panels
        const = cconst * rows + rconst * panel
        return dataclasses.replace(n, addr=Addr(_terms(terms), const, span=panel))

    data = program.input_map[buffer].reshape(rows, cols // panel, panel)
    return _relayout(program, buffer, rewrite,
                     np.ascontiguousarray(data.transpose(1, 0, 2)).ravel())


def pad_rows(program: Program, buffer: str, rows: int, cols: int, pad: int) -> Program:
    """Store input `buffer` (rows x cols, row-major) with a row pitch of cols + pad words (the
    pad words zero), so successive rows start `pad` words further along the SPM lines: a
    stream down a column no longer returns to one line every row. Accesses are rewritten;
    the DMA moves the pitched rows (docs/conventions.md#register-blocking)."""
    where = f"program {program.name!r}: pad_rows({buffer!r}, pad {pad})"
    if pad < 0:
        raise DFGError(f"{where}: the pad must not be negative")
    if pad == 0:
        return program

    def rewrite(k, n):
        if n.addr.index_stride:
            raise DFGError(f"{where}: node %{n.id} is an indirect access")
        row, rconst, col, cconst = _split_address(n.addr, cols, where)
        terms = {v: c * (cols + pad) for v, c in row.items()}
        for v, c in col.items():
            terms[v] = terms.get(v, 0) + c
        return dataclasses.replace(n, addr=dataclasses.replace(
            n.addr, terms=_terms(terms), const=rconst * (cols + pad) + cconst))

    data = program.input_map[buffer].reshape(rows, cols)
    padded = np.zeros((rows, cols + pad), dtype=data.dtype)
    padded[:, :cols] = data
    return _relayout(program, buffer, rewrite, padded.ravel(), size=rows * (cols + pad))


def pitch_output_rows(program: Program, buffer: str, rows: int, cols: int, pad: int) -> Program:
    """Store output `buffer` (rows x cols, row-major) with a row pitch of cols + pad words, as
    `pad_rows` does for an input: a register block's accumulators, rows of C a multiple of
    the line count apart, then flush to different lines. `Program.logical_output` drops the
    pad words again (docs/conventions.md#register-blocking)."""
    where = f"program {program.name!r}: pitch_output_rows({buffer!r}, pad {pad})"
    if pad < 0:
        raise DFGError(f"{where}: the pad must not be negative")
    if pad == 0:
        return program
    if any(b == buffer for b, _, _ in program.output_pitch):
        raise DFGError(f"{where}: the output is pitched already")

    def rewrite(k, n):
        if n.addr.index_stride:
            raise DFGError(f"{where}: node %{n.id} is an indirect access")
        row, rconst, col, cconst = _split_address(n.addr, cols, where)
        terms = {v: c * (cols + pad) for v, c in row.items()}
        for v, c in col.items():
            terms[v] = terms.get(v, 0) + c
        return dataclasses.replace(n, addr=dataclasses.replace(
            n.addr, terms=_terms(terms), const=rconst * (cols + pad) + cconst))

    size = rows * (cols + pad)
    kernels = tuple(dataclasses.replace(
        k, nodes=tuple(rewrite(k, n) if n.buffer == buffer else n for n in k.nodes),
        buffers=tuple(dataclasses.replace(b, size=size, pitch=(cols, cols + pad))
                      if b.name == buffer else b for b in k.buffers)) for k in program.kernels)
    return dataclasses.replace(program, kernels=kernels,
                               output_pitch=(*program.output_pitch, (buffer, cols, cols + pad)))
