"""`lane_select_sums`: a lane sum without a lane-sum unit, as lane-selecting multiplies
(docs/conventions.md#lane-select-sums).

An array without `vsum` (the MLX preset) splits a vectorised reduction in two kernels
(`lane_partials.lane_partial_sums`): the partials, `lanes` words per result, go out to DRAM
and come back for the lane-sum kernel -- for the SDDMM at density 0.01 that round trip is more
DRAM traffic than its operands. Where the reduction's whole chunk loop is in one body
(`transform.block_lane_sums` by the chunk loop's extent, one lane sum per result per
iteration), each lane sum can instead be done in place by the multiplier: a `mul` with
`Node.lane` set takes one lane of its vector input, and its value is a scalar
(`graph.vector_nodes`), so

    s = vsum(v) * c    becomes    s = sum over l of mul(v.lane l, c)   (a tree of adds)

with `c` the common scalar the lane sum was multiplied by (the SDDMM's mask value), or a
constant 1.0 where there is none. `lanes` multiplies and `lanes - 1` adds a result instead of
one lane sum: on the MLX preset the multiplier and the adder have the slots (the row-blocked
SDDMM's loads bind, 19 a nonzero on 16 load/store units). The sums are in another order (each
lane scaled, then the lanes as a tree): fp32 tolerances.

With the whole reduction in one body each result is then written once: `store_once` makes its
accumulation a store (no read of the zeroed word: one SPM read less a nonzero).
"""

from __future__ import annotations

import dataclasses

from dataflow.dfg import transform
from dataflow.dfg.graph import BufferRole, DFGError, Kernel, Node, vector_nodes
from dataflow.dfg.ops import Op


def lane_select_sums(kernel: Kernel, lanes: int) -> Kernel:
    """`kernel` with every `vsum` replaced by `lanes` lane-selecting `mul`s added as a tree (the
    module docstring); a `vsum` whose one user is a `mul` by a scalar takes that scalar into
    its multiplies. DFGError where there is no lane sum."""
    where = f"kernel {kernel.name!r}: lane_select_sums"
    sums = [n for n in kernel.nodes if n.op is Op.VSUM]
    if not sums:
        raise DFGError(f"{where}: no lane sum")
    users = transform.users_of(kernel)
    vec = vector_nodes(kernel)
    nodes = {n.id: n for n in kernel.nodes}
    next_id = max(nodes) + 1
    emit: dict[int, list[Node]] = {}  # the node replaced (vsum or its scaling mul) -> new
    dropped: set[int] = set()
    remap: dict[int, int] = {}  # a replaced node's id -> its replacement's
    for s in sums:
        new: list[Node] = []
        scale_node = None
        use = users[s.id]
        if len(use) == 1:
            u = nodes[use[0]]
            if u.op is Op.MUL and u.lane is None:
                other = [i for i in u.inputs if i != s.id]
                if len(other) == 1 and other[0] not in vec:
                    scale_node = u
        if scale_node is not None:
            scale = next(i for i in scale_node.inputs if i != s.id)
        else:
            new.append(Node(next_id, Op.CONST, value=1.0, name="1"))
            scale, next_id = next_id, next_id + 1
        level = []
        for lane in range(lanes):
            new.append(Node(next_id, Op.MUL, (s.inputs[0], scale), lane=lane,
                            name=f"lane {lane}"))
            level.append(next_id)
            next_id += 1
        while len(level) > 1:
            nxt = []
            for j in range(0, len(level), 2):
                if j + 1 == len(level):
                    nxt.append(level[j])
                    continue
                new.append(Node(next_id, Op.ADD, (level[j], level[j + 1]), name="lanes +"))
                nxt.append(next_id)
                next_id += 1
            level = nxt
        last = scale_node if scale_node is not None else s
        dropped |= {s.id, last.id}
        remap[last.id] = level[0]
        emit[last.id] = new
    body: list[Node] = []
    for n in kernel.nodes:
        if n.id in emit:
            body.extend(emit[n.id])
        elif n.id not in dropped:
            body.append(dataclasses.replace(n, inputs=tuple(remap.get(i, i) for i in n.inputs)))
    carried = tuple((remap.get(a, a), remap.get(b, b), d) for a, b, d in kernel.carried
                    if a not in dropped - set(remap) and b not in dropped - set(remap))
    # each replacement stands where the node it replaces stood: inputs still precede users
    out = transform._renumber(kernel, body, carried)
    out.verify()
    return out


def store_once(kernel: Kernel) -> Kernel:
    """`kernel` with each `acc` that writes its word once in the whole kernel made a `store`
    (the row-blocked SDDMM's C[p] after its lane-select sum): the same value into a zeroed
    output, without the read of the old word. Once means: its buffer an output that no other
    node touches, its address moving with a sparse loop whose only outer loop is its parent
    (positions are disjoint across parents), every other loop inside that one of extent 1 or
    the vector loop, and the address not moving with the vector loop. `kernel` itself where
    none is."""
    loops = kernel.loops
    if len(loops) < 2 or loops[0].var != loops[1].parent or loops[1].is_dense:
        return kernel
    p = loops[1].var
    if any(lp.extent != 1 and lp.var != kernel.vector_var for lp in loops[2:]):
        return kernel
    outputs = {b.name for b in kernel.buffers if b.role == BufferRole.OUTPUT}
    once = {n.id for n in kernel.nodes
            if n.op is Op.ACC and n.buffer in outputs and n.addr.coef(p) > 0
            and not n.addr.span and not n.addr.index_stride
            and (kernel.vector_var is None or not n.addr.coef(kernel.vector_var))
            and all(m.buffer != n.buffer for m in kernel.nodes if m.id != n.id)}
    if not once:
        return kernel
    nodes = tuple(dataclasses.replace(n, op=Op.STORE) if n.id in once else n
                  for n in kernel.nodes)
    carried = tuple(e for e in kernel.carried if e[0] not in once and e[1] not in once)
    out = dataclasses.replace(kernel, nodes=nodes, carried=carried)
    out.verify()
    return out


__all__ = ["lane_select_sums", "store_once"]
