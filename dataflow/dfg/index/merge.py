"""Co-iteration: element-wise statements over sparse operands, `C[i,j] = A[i,j] + B[i,j]` (the
union of the stored entries) or `A[i,j] * B[i,j]` (the intersection; a dense operand stores
every entry).

Co-iterating two sparse operands is a merge of their sorted coordinate lists (SAM's union and
intersection joiners). The merge depends on the pos/crd arrays only, so it is resolved when
lowering (the symbolic phase): `coiterate` computes the merged structure S (CSR over a 2-D
view) and, per operand, the position of each entry of S among that operand's values, or a zero
slot where the operand has no entry. The kernel (the numeric phase, `merge_kernel`) streams S
and gathers each operand's value through its position map (PIT's SRead); where an operand's
structure *is* S the map is the identity and the values are streamed directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node
from dataflow.dfg.ops import Op

KINDS = {"add": Op.ADD, "multiply": Op.MUL}


@dataclass(frozen=True, eq=False)
class EwOperand:
    """One operand of a 2-D view: dense (`pos` None; `val` row-major R*C) or CSR with sorted,
    unique column indices per row."""

    val: np.ndarray
    pos: np.ndarray | None = None
    crd: np.ndarray | None = None

    @property
    def is_dense(self) -> bool:
        return self.pos is None


@dataclass(frozen=True, eq=False)
class Coiteration:
    """The merged structure S of two operands and how to read each operand along it.

    `maps[x]` is None where operand x is read directly along S (dense operand with S the full
    grid, or a sparse operand whose structure is S), else int64 positions into the operand's
    values extended by one zero slot at the end (dense operands: None, read through crd)."""

    shape: tuple[int, int]
    pos: np.ndarray
    crd: np.ndarray
    maps: tuple[np.ndarray | None, np.ndarray | None]

    @property
    def nnz(self) -> int:
        return int(self.pos[-1])

    @property
    def full(self) -> bool:
        """S is every entry of the grid, in row-major order (so position p = i * C + j)."""
        r, c = self.shape
        return self.nnz == r * c


def _keys(x: EwOperand, cols: int) -> np.ndarray:
    rows = np.repeat(np.arange(len(x.pos) - 1, dtype=np.int64), np.diff(x.pos))
    return rows * cols + np.asarray(x.crd, np.int64)


def _check_operands(shape: tuple[int, int], a: EwOperand, b: EwOperand) -> None:
    r, c = shape
    for name, x in (("A", a), ("B", b)):
        if x.is_dense:
            if x.val.size != r * c:
                raise DFGError(f"dense operand {name} has {x.val.size} values for shape {shape}")
        elif len(x.pos) != r + 1 or int(x.pos[-1]) != len(x.crd) or len(x.crd) != len(x.val):
            raise DFGError(f"malformed CSR operand {name}: pos has {len(x.pos)} entries for {r} "
                           f"rows, crd {len(x.crd)}, val {len(x.val)}")


def coiterate(kind: str, shape: tuple[int, int], a: EwOperand, b: EwOperand) -> Coiteration:
    """The symbolic phase: output structure and per-operand position maps (no values read)."""
    if kind not in KINDS:
        raise DFGError(f"unknown element-wise op {kind!r}; choose one of {list(KINDS)}")
    _check_operands(shape, a, b)
    r, c = shape
    sparse = [x for x in (a, b) if not x.is_dense]
    keys = [_keys(x, c) for x in sparse]
    for k in keys:
        if k.size and not np.all(k[1:] > k[:-1]):
            raise DFGError("CSR operands need sorted, unique column indices in every row")
    if kind == "add" and len(sparse) < 2 or not sparse:
        s_keys = np.arange(r * c, dtype=np.int64)  # a dense operand takes part everywhere
    elif len(sparse) == 1:
        s_keys = keys[0]  # multiply with a dense operand: the sparse one's entries
    elif kind == "add":
        s_keys = np.union1d(keys[0], keys[1])
    else:
        s_keys = np.intersect1d(keys[0], keys[1], assume_unique=True)
    rows = s_keys // c if c else s_keys
    pos = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=r))]).astype(np.int64)
    maps = []
    for x in (a, b):
        if x.is_dense:
            maps.append(None)
            continue
        k = keys[0] if x is sparse[0] else keys[1]
        if len(k) == len(s_keys) and np.array_equal(k, s_keys):
            maps.append(None)
            continue
        at = np.searchsorted(k, s_keys)
        hit = at < len(k)
        hit[hit] = k[at[hit]] == s_keys[hit]
        maps.append(np.where(hit, at, len(k)).astype(np.int64))  # len(k): the zero slot
    return Coiteration((r, c), pos, (s_keys % c if c else s_keys).astype(np.int64),
                       (maps[0], maps[1]))


def merge_kernel(kind: str, co: Coiteration, dense: tuple[bool, bool], sizes: tuple[int, int],
                 sparse_output: bool, names: tuple[str, str, str] = ("A", "B", "C"),
                 name: str | None = None) -> Kernel:
    """for i, for p in S.pos[i]..S.pos[i+1]: C(p) = A(p) op B(p), each operand read along S
    directly, through crd (dense operand) or through its position map (sparse operand).
    `names`: the two operands' and the output's buffers; `sizes`: the operands' words."""
    r, c = co.shape
    nodes: list[Node] = []
    buffers: list[Buffer] = []
    crd_id: list[int] = []

    def add(op, inputs=(), **kw) -> int:
        nodes.append(Node(len(nodes), op, tuple(inputs), **kw))
        return len(nodes) - 1

    def crd() -> int:
        # one load per use: with one crd load feeding both the gather and the scatter the
        # default 8x8 arch got II = 2 after a long route search; two loads map at II = 1
        if not crd_id:
            buffers.append(Buffer("S_crd", co.nnz))
        crd_id.append(add(Op.LOAD, buffer="S_crd", addr=Addr((("p", 1),)), name="crd"))
        return crd_id[-1]

    at_p = Addr((("p", 1),))
    vals = []
    for x, is_dense, mp, size in zip(names[:2], dense, co.maps, sizes):
        if is_dense and co.full:
            vals.append(add(Op.LOAD, buffer=x, addr=at_p, name=x.lower()))
        elif is_dense:
            vals.append(add(Op.GATHER, (crd(),), buffer=x, addr=Addr((("i", c),), index_stride=1),
                            name=f"{x}[i, crd]"))
        elif mp is None:
            vals.append(add(Op.LOAD, buffer=x, addr=at_p, name=x.lower()))
        else:
            idx = add(Op.LOAD, buffer=f"{x}_map", addr=at_p, name=f"{x}_map")
            buffers.append(Buffer(f"{x}_map", co.nnz))
            vals.append(add(Op.GATHER, (idx,), buffer=x, addr=Addr(index_stride=1),
                            name=f"{x}[map]"))
        buffers.append(Buffer(x, size))
    out = add(KINDS[kind], vals, name=kind)
    cbuf = names[2]
    if sparse_output:
        add(Op.STORE, (out,), buffer=cbuf, addr=at_p, name=f"{cbuf}.val=")
        buffers.append(Buffer(cbuf, co.nnz, "output"))
    elif co.full:
        add(Op.STORE, (out,), buffer=cbuf, addr=at_p, name=f"{cbuf}=")
        buffers.append(Buffer(cbuf, r * c, "output"))
    else:  # dense result of a sparse pattern: scatter into the zeroed C
        add(Op.SCATTER, (crd(), out), buffer=cbuf, addr=Addr((("i", c),), index_stride=1),
            name=f"{cbuf}[i, crd]=")
        buffers.append(Buffer(cbuf, r * c, "output"))
    return Kernel(name=name or f"{kind}_coiterate",
                  loops=(Loop("i", r), Loop("p", pos="S_pos", parent="i")),
                  nodes=tuple(nodes), buffers=tuple(buffers),
                  domain_arrays=(("S_pos", co.pos),))


def merge_inputs(co: Coiteration, values: tuple[np.ndarray, np.ndarray], dtype,
                 names: tuple[str, str] = ("A", "B")) -> list[tuple[str, np.ndarray]]:
    """The program inputs of `merge_kernel` but S's crd: each operand's values (with the zero
    slot where it is read through a map) and its map."""
    inputs = []
    for x, val, mp in zip(names, values, co.maps):
        v = np.ascontiguousarray(val, dtype=dtype).ravel()
        if mp is not None:
            v = np.concatenate([v, np.zeros(1, dtype)])  # the zero slot absent entries read
            inputs.append((f"{x}_map", mp))
        inputs.append((x, v))
    return inputs
