"""Nonzero unroll: a CSR row's nonzeros u at a time (docs/conventions.md#nonzero-unroll).

`unroll_nonzeros(program, u)` rewrites a one-kernel program whose innermost loop runs over a
CSR operand's nonzeros (the SpMM: C[i, :] += val[p] * B[crd[p], :]) so that one iteration
takes u nonzeros of a row:

- layout: each row's nonzero list is padded to a multiple of u (`pad_rows`) with explicit
  zeros -- value 0, column the row's last real column, so a padded gather reads a B row the
  row has just read -- and the sparse loop runs over the padded positions / u (a new pos
  array);
- body: every load at the position, X[p], becomes one row load X[u*p : u] (u consecutive
  words, one SPM row when u divides the row width); every node that depends on the position
  is copied u times, copy l taking lane l of the row loads: a gather selects lane l of its
  index (`Node.lane` on a gather), a mul / macc lane l of its value (input 0).

Per u nonzeros the body reads 2 rows (values, columns) and the gathers, where it read 2u
scalars: the load/store unit issues 2 + u*v ops for u*v vector MACs instead of u*(2 + v).
The padded products are exact zeros (0 * b for a finite b); each copy accumulates in its own
register and flushes into C at the row's end, so a row's sum is added in another order (fp32
tolerances). The useful MACs (`Program.macs`) stay the real ones; the pads are moved by the
DMA and issued by the array like any nonzero.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.dfg.graph import Addr, Kernel, Node, Program
from dataflow.dfg.ops import Op
from dataflow.dfg.transform import depends_on, users_of


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What `unroll_nonzeros` rewrites: the sparse loop, its parent, its pos array, the index
    buffers (read by gathers: padded with the row's last column) and the value buffers (read
    by multiplies: padded with zeros)."""

    var: str
    pos: str
    index: tuple[str, ...]
    values: tuple[str, ...]


def shape(program: Program) -> _Shape | None:
    """The program's nonzero loop as `unroll_nonzeros` needs it, or None: one kernel, a
    vector loop, its innermost loop sparse; every load that moves with it reads a program
    input at exactly the position and feeds only gathers (as their index) or only multiplies
    (as a factor); every accumulation that depends on it takes a product with such a factor
    (so a padded nonzero adds an exact zero); no store moves with it; no carried edge but an
    accumulation's recurrence on itself."""
    if len(program.kernels) != 1:
        return None
    k = program.kernels[0]
    lp = k.loops[-1]
    # the one carried edge allowed: an accumulation's own register recurrence
    if lp.is_dense or k.vector_var is None or any(
            s != d or not k.nodes[s].op.accumulates for s, d, _ in k.carried):
        return None
    users, dep = users_of(k), depends_on(k, lp.var)
    index, values = set(), set()
    for n in k.nodes:
        if n.addr is None or not n.addr.coef(lp.var):
            continue
        if (n.op is not Op.LOAD or n.addr.terms != ((lp.var, 1),) or n.addr.const
                or n.addr.span or n.buffer not in program.input_map or n.hold):
            return None
        us = [k.nodes[i] for i in users[n.id]]
        if us and all(u.op is Op.GATHER and u.lane is None for u in us):
            index.add(n.id)
        elif us and all(u.op in (Op.MUL, Op.MACC) and u.lane is None for u in us):
            values.add(n.id)
        else:
            return None
    for n in k.nodes:
        if n.id not in dep or n.id in index or n.id in values:
            continue
        if n.op in (Op.STORE, Op.SCATTER, Op.SCATTER_ACC, Op.ACC_MAX, Op.VSUM):
            return None
        if n.op.accumulates and not _zero_product(k, n, values):
            return None
    if not index or not values:
        return None
    name = {i: k.nodes[i].buffer for i in index | values}
    return _Shape(lp.var, lp.pos, tuple(sorted({name[i] for i in index})),
                  tuple(sorted({name[i] for i in values})))


def _zero_product(k: Kernel, n: Node, values: set[int]) -> bool:
    """Whether accumulation `n` adds a product one of whose factors is a value load."""
    src = n if n.op is Op.MACC else k.nodes[n.inputs[0]]
    return src.op in (Op.MUL, Op.MACC) and any(i in values for i in src.inputs)


def pad_rows(pos: np.ndarray, u: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, pos_u): for each padded position the nonzero it copies (-1 for a row's pads,
    which the caller fills) and the unrolled loop's pos array (padded positions / u)."""
    pos = np.asarray(pos, dtype=np.int64)
    counts = np.diff(pos)
    padded = -(-counts // u) * u
    ppos = np.concatenate(([0], np.cumsum(padded)))
    src = np.full(int(ppos[-1]), -1, dtype=np.int64)
    row = np.repeat(np.arange(len(counts)), counts)
    at = ppos[row] + (np.arange(int(pos[-1])) - pos[row])
    src[at] = np.arange(int(pos[-1]))
    return src, ppos // u


def _padded(data: np.ndarray, src: np.ndarray, pos: np.ndarray, ppos_u: np.ndarray, u: int,
            zero: bool) -> np.ndarray:
    """`data` at the padded positions: a pad holds zero, or the row's last real entry."""
    out = np.zeros(len(src), dtype=data.dtype)
    real = src >= 0
    out[real] = data[src[real]]
    if not zero and (~real).any():
        counts = np.diff(np.asarray(pos, dtype=np.int64))
        rows = np.repeat(np.arange(len(counts)), np.diff(ppos_u) * u)
        last = np.asarray(pos, dtype=np.int64)[1:] - 1
        out[~real] = data[last[rows[~real]]]
    return out


def unroll_nonzeros(program: Program, u: int, tree: bool = False) -> Program | None:
    """`program` with its nonzero loop unrolled by u over rows padded to multiples of u (module
    docstring), or None where `shape` refuses it. `tree`: each accumulation's u terms summed
    by a tree of adds into one acc; else u accumulations of the one address (each its own
    register, flushed at the row's end; fused into u maccs by the compiler)."""
    got = shape(program)
    if got is None or u < 2:
        return None
    k = program.kernels[0]
    pos = k.domain[got.pos]
    src, pos_u = pad_rows(pos, u)
    inputs = dict(program.input_map)
    for name in (*got.index, *got.values):
        inputs[name] = _padded(inputs[name], src, pos, pos_u, u, zero=name in got.values)
    new_pos = f"{got.pos}_by{u}"
    loops = tuple(dataclasses.replace(lp, pos=new_pos) if lp.var == got.var else lp
                  for lp in k.loops)
    bufs = tuple(dataclasses.replace(b, size=len(src))
                 if b.name in got.index + got.values else b for b in k.buffers)
    nodes, ids = _body(k, got, u, tree)
    carried = tuple((ids[(s, c)], ids[(s, c)], d) for s, _, d in k.carried
                    for c in range(u) if (s, c) in ids)  # an acc is once, a macc u times
    kern = dataclasses.replace(k, loops=loops, buffers=bufs, nodes=nodes, carried=carried,
                               domain_arrays=(*k.domain_arrays, (new_pos, pos_u)))
    useful = dict(program.useful_words)
    for name in (*got.index, *got.values):  # the pads are not compulsory
        useful.setdefault(name, int(program.input_map[name].size))
    prog = dataclasses.replace(program, kernels=(kern,),
                               inputs=tuple((n, inputs[n]) for n, _ in program.inputs),
                               useful_words=tuple(useful.items()))
    prog.verify()
    return prog


def _body(k: Kernel, got: _Shape, u: int, tree: bool) -> tuple[tuple[Node, ...], dict]:
    """The unrolled body: row loads of the position's buffers, then u copies of every node
    that depends on the position, copy l selecting lane l; the other nodes once. With the
    map (old id, copy) -> new id (copy 0 for the nodes kept once)."""
    dep = depends_on(k, got.var)
    rows = {n.id for n in k.nodes if n.addr is not None and n.addr.coef(got.var)}
    nodes: list[Node] = []
    ids: dict[tuple[int, int], int] = {}  # (old id, copy) -> new id (copy 0 for shared)
    for n in k.nodes:
        if n.id in rows:
            addr = Addr(((got.var, u),), 0, span=u)
            nodes.append(dataclasses.replace(n, id=len(nodes), addr=addr))
            ids[(n.id, 0)] = len(nodes) - 1
            continue
        if tree and n.op is Op.ACC and n.id in dep:  # the u terms summed first: one accumulation
            total = _tree(nodes, [ids[(n.inputs[0], c)] for c in range(u)])
            nodes.append(dataclasses.replace(n, id=len(nodes), inputs=(total,)))
            ids[(n.id, 0)] = len(nodes) - 1
            continue
        for c in range(u if n.id in dep else 1):
            ins, lane = [], n.lane
            for i in n.inputs:
                ins.append(ids[(i, c if i in dep and i not in rows else 0)])
            picked = [j for j, i in enumerate(n.inputs) if i in rows]
            if picked:  # a gather's index or a multiply's factor: its lane of the row
                j = picked[0]
                ins = [ins[j], *ins[:j], *ins[j + 1:]]
                lane = c
            nodes.append(dataclasses.replace(n, id=len(nodes), inputs=tuple(ins), lane=lane))
            ids[(n.id, c)] = len(nodes) - 1
    return tuple(nodes), ids


def _tree(nodes: list[Node], terms: list[int]) -> int:
    """Append a balanced tree of adds over `terms` (node ids) to `nodes`; its root's id."""
    while len(terms) > 1:
        nxt = []
        for a, b in zip(terms[::2], terms[1::2]):
            nodes.append(Node(len(nodes), Op.ADD, (a, b)))
            nxt.append(len(nodes) - 1)
        terms = nxt + terms[len(terms) - len(terms) % 2:]
    return terms[0]
