"""`block_partial_sums`: register blocking of a vector accumulation into lane partials
(docs/conventions.md#row-blocked-lane-partials).

On an array without a lane-sum unit the SDDMM's reduction is split in two kernels
(`lane_partials.lane_partial_sums`, docs/conventions.md#lane-partial-sums); the first
accumulates, per nonzero, `k / lanes` vector products into the nonzero's row of partials:

    for i, for p in row i, for c in [0, k / lanes), for l (vector):
        C_lanes[lanes * p + l] += A[i, lanes * c + l] * Bᵀ[crd[p], lanes * c + l]

One vector product an iteration: the row of A is read again next to every gather of Bᵀ, and
the accumulation's register run is the chunk loop. `block_partial_sums(kernel, "c", k /
lanes)` puts the whole chunk loop in one body, as `transform.block_lane_sums` does for a kernel
with lane sums: the products in pairs (a `mul` and a `mac`), the pairs added as a tree of
`add`s, one accumulation of the sum. The loop over a row's nonzeros is then the innermost
moving loop and the row of A is invariant over it, so `transform.hold_invariant_loads` holds it
(docs/conventions.md#held-loads): the SPM ports serve the gathers. Sums in another order: fp32
tolerances.
"""

from __future__ import annotations

from dataflow.dfg import transform
from dataflow.dfg.graph import DFGError, Kernel, Node, vector_nodes
from dataflow.dfg.ops import Op


def _groups(kernel: Kernel, users: dict) -> dict[tuple, list[Node]]:
    """The vector accumulations fed by a product used only there, by (buffer, address)."""
    nodes = {n.id: n for n in kernel.nodes}
    vec = vector_nodes(kernel)
    groups: dict[tuple, list[Node]] = {}
    for n in kernel.nodes:
        if n.op is not Op.ACC or n.id not in vec:
            continue
        src = nodes[n.inputs[0]]
        if src.op is Op.MUL and src.lane is None and users[src.id] == [n.id]:
            groups.setdefault((n.buffer, str(n.addr)), []).append(n)
    return groups


def applies(kernel: Kernel) -> bool:
    """Whether `kernel` is a partials kernel `block_partial_sums` may block: a vector loop of
    one vector innermost, a dense loop outside it, no lane sum, and a vector accumulation of a
    product at an address that loop does not move."""
    vv = kernel.vector_var
    if vv is None or len(kernel.loops) < 2 or kernel.loops[-1].var != vv:
        return False
    if any(n.op is Op.VSUM for n in kernel.nodes):
        return False
    outer = kernel.loops[-2]
    if not outer.is_dense or outer.extent < 2:
        return False
    return any(not m.addr.coef(outer.var) for ms in _groups(kernel, transform.users_of(kernel))
               .values() for m in ms)


def _merged(members: list[Node], terms: list[Node], next_id: int,
            var: str) -> tuple[list[Node], int]:
    """One group's replacement: the products in pairs (`mul`, `mac`), the pairs added as a
    tree, the last member's `acc` of the sum; and the next free id."""
    new: list[Node] = []

    def add(op, inputs):
        nonlocal next_id
        new.append(Node(next_id, op, tuple(inputs), name=f"block {var}"))
        next_id += 1
        return new[-1]

    level = []
    for j in range(0, len(terms), 2):
        first = add(Op.MUL, terms[j].inputs)
        level.append(first if j + 1 == len(terms) else
                     add(Op.MAC, (*terms[j + 1].inputs, first.id)))
    while len(level) > 1:
        level = [add(Op.ADD, (level[j].id, level[j + 1].id)) if j + 1 < len(level)
                 else level[j] for j in range(0, len(level), 2)]
    new.append(Node(members[-1].id, Op.ACC, (level[0].id,), buffer=members[0].buffer,
                    addr=members[0].addr, name=members[0].name))
    return new, next_id


def block_partial_sums(kernel: Kernel, var: str, factor: int) -> Kernel:
    """Loop `var` (dense, outside the vector loop) unrolled-and-jammed by `factor`
    (neighbouring iterations), then the `factor` `mul` -> `acc` pairs that accumulate at one
    address merged: products in pairs (`mul`, `mac`), the pairs added as a tree, one `acc`
    (the module docstring). DFGError where a group is not `factor` such pairs or a carried
    edge other than an accumulation's own touches it."""
    where = f"kernel {kernel.name!r}: block_partial_sums({var!r}, {factor})"
    if var == kernel.vector_var:
        raise DFGError(f"{where}: blocks a loop outside the vector loop")
    k1 = transform.unroll_and_jam(kernel, var, factor, inner=True)
    if factor == 1:
        return k1
    nodes = {n.id: n for n in k1.nodes}
    users = transform.users_of(k1)
    touched = {x for s, d, _ in k1.carried if s != d for x in (s, d)}
    dropped: set[int] = set()
    emit: dict[int, list[Node]] = {}  # last member's id -> the nodes that replace the group
    next_id = max(nodes) + 1
    groups = _groups(k1, users)
    if not groups:
        raise DFGError(f"{where}: no vector accumulation of a product")
    for members in groups.values():
        if len(members) != factor:
            raise DFGError(f"{where}: {len(members)} accumulations at one address, not {factor}")
        terms = [nodes[m.inputs[0]] for m in members]
        new, next_id = _merged(members, terms, next_id, var)
        dropped |= {m.id for m in members[:-1]} | {t.id for t in terms}
        emit[members[-1].id] = new
    if dropped & touched:
        raise DFGError(f"{where}: a loop-carried edge touches a merged accumulation")
    body = transform.merged_body(k1.nodes, emit, dropped)
    kept = {n.id for n in body}
    carried = tuple(e for e in k1.carried if e[0] in kept and e[1] in kept)
    out = transform._renumber(k1, body, carried)
    out.verify()
    return out


__all__ = ["applies", "block_partial_sums"]
