"""`lane_partial_sums`: a vectorised reduction without a lane-sum unit
(docs/conventions.md#lane-partial-sums).

`vectorise_reduction` runs a dot product `lanes` terms per iteration and sums each vector's
lanes (`vsum`) before the scalar accumulation. An array without `vsum` (the MLX preset) could
only run it scalar again (`transform.devectorise_reduction`: one term per iteration). Instead
the reduction is split in two steps:

1. the vector kernel, its lane sum gone: the accumulation becomes a vector one into a partial
   buffer of `lanes` words per result (result e's lane l at e * lanes + l), so each lane adds
   its terms in its PE's register over the chunk loop and flushes one SPM row per result;
2. lane-sum kernels: result[e] += the sum of its `lanes` partials -- a vector loop over whole
   vectors of results (load l's lane j reads result j's partial l, `lanes` words apart: the
   loads of one vector read the same `lanes` rows), added as a tree (lanes loads, lanes - 1
   adds, one accumulation: 16 nodes for 8 lanes), and a scalar kernel over (e, l) for the
   results past the last whole vector.

A scalar factor of every term stored at the result's own word (the SDDMM's mask value M[p]
for C[p]) leaves the vector kernel and multiplies each result once in the lane-sum kernels.

A reduction of k terms then takes k / lanes vector iterations per result plus one vector
iteration per `lanes` results, instead of k scalar iterations. The sums are in another order
(each lane's terms, then the lanes as a tree): fp32 tolerances, as any vectorised reduction
(docs/conventions.md#fp32-tolerances).
"""

from __future__ import annotations

import dataclasses

from dataflow.dfg import transform
from dataflow.dfg.graph import (
    Addr,
    Buffer,
    BufferRole,
    DFGError,
    Kernel,
    Loop,
    Node,
    Program,
    vector_nodes,
)
from dataflow.dfg.ops import Op


def _vector_form(kernel: Kernel, lanes: int) -> Kernel:
    """`kernel` with a lane sum before its accumulation: as it is, or a scalar kernel's
    innermost dense reduction loop split by `lanes` and vectorised."""
    if kernel.vector_var is not None:
        return kernel
    lp = kernel.loops[-1]
    where = f"kernel {kernel.name!r}: lane_partial_sums"
    if len(kernel.loops) < 2 or not lp.is_dense or lp.extent % lanes or lp.extent < 2 * lanes:
        raise DFGError(f"{where}: the innermost loop is not a dense reduction of whole, "
                       "several vectors")
    split = transform.split(kernel, lp.var, lanes)
    return transform.vectorise_reduction(split, split.loops[-1].var)


def _renumber(kernel: Kernel, nodes: list[Node]) -> Kernel:
    remap = {n.id: new for new, n in enumerate(nodes)}
    out = tuple(dataclasses.replace(n, id=remap[n.id], inputs=tuple(remap[i] for i in n.inputs))
                for n in nodes)
    carried = tuple((remap[s], remap[d], dist) for s, d, dist in kernel.carried
                    if s in remap and d in remap)
    return dataclasses.replace(kernel, nodes=out, carried=carried)


def lane_partial_kernels(kernel: Kernel, lanes: int) -> tuple[Kernel, ...]:
    """(vector kernel into partials, lane-sum kernels) for a kernel with one lane sum feeding
    one accumulation (or a scalar reduction that `_vector_form` vectorises); DFGError when
    it has another shape."""
    where = f"kernel {kernel.name!r}: lane_partial_sums"
    vk = _vector_form(kernel, lanes)
    vv = vk.vector_var
    if vk.loops[-1].var != vv or vk.loops[-1].extent != lanes:
        raise DFGError(f"{where}: the vector loop must be innermost, one vector wide")
    sums = [n for n in vk.nodes if n.op is Op.VSUM]
    users = [n for n in vk.nodes if sums and sums[0].id in n.inputs]
    if len(sums) != 1 or len(users) != 1 or users[0].op is not Op.ACC:
        raise DFGError(f"{where}: needs one lane sum whose one user is an acc")
    vsum, acc = sums[0], users[0]
    writers = [n for n in vk.nodes if n.op.writes_spm and n.buffer == acc.buffer]
    if writers != [acc] or acc.addr.coef(vv) or acc.addr.span:
        raise DFGError(f"{where}: the acc must be the only writer of {acc.buffer!r}, at an "
                       "address the vector loop does not move")
    out_buf = vk.buffer_map[acc.buffer]
    part = f"{acc.buffer}_lanes"
    paddr = Addr(tuple((v, c * lanes) for v, c in acc.addr.terms) + ((vv, 1),),
                 acc.addr.const * lanes)
    src, scale = vsum.inputs[0], _common_scale(vk, vsum, acc)
    gone = {vsum.id}
    if scale is not None:  # the vector term's factor, multiplied once after the lane sum
        product = vk.nodes[vsum.inputs[0]]
        src = next(i for i in product.inputs if i != scale.id)
        gone |= {product.id, scale.id}
    nodes = [dataclasses.replace(acc, inputs=(src,), buffer=part, addr=paddr,
                                 name=f"{part}+=") if n is acc else n
             for n in vk.nodes if n.id not in gone]
    used = {n.buffer for n in nodes}  # a hoisted scale's buffer is the lane sums' now
    buffers = tuple(Buffer(part, out_buf.size * lanes, BufferRole.OUTPUT)
                    if b.name == acc.buffer else b for b in vk.buffers
                    if b.name in used or b.name == acc.buffer)
    k1 = _renumber(dataclasses.replace(vk, buffers=buffers), nodes)
    k1.verify()
    scale_buf = None if scale is None else vk.buffer_map[scale.buffer]
    return (k1, *_lane_sum_kernels(kernel.name, part, out_buf, lanes, scale_buf))


def _common_scale(vk: Kernel, vsum: Node, acc: Node) -> Node | None:
    """The scalar load that multiplies every term of the reduction, at the result's own word
    (the SDDMM's mask value M[p] for C[p]): the lane sum's input is mul(vector, that load),
    each used only there. None when there is none."""
    product = vk.nodes[vsum.inputs[0]]
    if product.op is not Op.MUL or product.lane is not None:
        return None
    vec = vector_nodes(vk)
    uses = {n.id: [m.id for m in vk.nodes if n.id in m.inputs] for n in vk.nodes}
    for i in product.inputs:
        node, other = vk.nodes[i], [j for j in product.inputs if j != i]
        if (node.op is Op.LOAD and i not in vec and len(other) == 1 and other[0] in vec
                and node.addr == acc.addr and uses[i] == [product.id]
                and uses[product.id] == [vsum.id]):
            return node
    return None


def _lane_sum_kernels(name: str, part: str, out: Buffer, lanes: int,
                      scale: Buffer | None = None) -> tuple[Kernel, ...]:
    """result[e] += scale[e] * sum over l of part[e * lanes + l] (no scale: the sum): a
    vector kernel over whole vectors of results (lane j of load l reads result j's partial
    l: lanes words apart, so one vector's loads read the same `lanes` rows), the loads added
    as a tree; a scalar one for the rest (each partial scaled, then added)."""
    whole, rest = divmod(out.size, lanes)
    bufs = (Buffer(part, out.size * lanes), out) + (() if scale is None else (scale,))
    kernels = []
    if whole:
        at = (("eo", lanes * lanes), ("ei", lanes))
        nodes = [Node(j, Op.LOAD, buffer=part, addr=Addr(at, j), name=f"partial {j}")
                 for j in range(lanes)]
        level = list(range(lanes))
        while len(level) > 1:
            nxt = []
            for a, b in zip(level[::2], level[1::2]):
                nodes.append(Node(len(nodes), Op.ADD, (a, b), name="+"))
                nxt.append(len(nodes) - 1)
            level = nxt + ([level[-1]] if len(level) % 2 else [])
        total, at_out = level[0], Addr((("eo", lanes), ("ei", 1)))
        if scale is not None:
            nodes.append(Node(len(nodes), Op.LOAD, buffer=scale.name, addr=at_out,
                              name=scale.name))
            nodes.append(Node(len(nodes), Op.MUL, (total, len(nodes) - 1), name="*"))
            total = len(nodes) - 1
        nodes.append(Node(len(nodes), Op.ACC, (total,), buffer=out.name, addr=at_out,
                          name=f"{out.name}+="))
        k = Kernel(name=f"{name}.lanes", loops=(Loop("eo", whole), Loop("ei", lanes)),
                   nodes=tuple(nodes), buffers=bufs, vector_var="ei",
                   carried=((len(nodes) - 1,) * 2 + (1,),))
        k.verify()
        kernels.append(k)
    if rest:
        base = whole * lanes
        at_out = Addr((("e", 1),), base)
        nodes = [Node(0, Op.LOAD, buffer=part, addr=Addr((("e", lanes), ("l", 1)),
                                                         base * lanes), name="partial")]
        if scale is not None:
            nodes += [Node(1, Op.LOAD, buffer=scale.name, addr=at_out, name=scale.name),
                      Node(2, Op.MUL, (0, 1), name="*")]
        nodes.append(Node(len(nodes), Op.ACC, (len(nodes) - 1,), buffer=out.name,
                          addr=at_out, name=f"{out.name}+="))
        k = Kernel(name=f"{name}.lanes_rest", loops=(Loop("e", rest), Loop("l", lanes)),
                   nodes=tuple(nodes), buffers=bufs, carried=((len(nodes) - 1,) * 2 + (1,),))
        k.verify()
        kernels.append(k)
    return tuple(kernels)


def applies(kernel: Kernel, lanes: int) -> bool:
    """Whether `lane_partial_kernels` takes `kernel`: a lane sum, or a scalar reduction."""
    try:
        lane_partial_kernels(kernel, lanes)
    except DFGError:
        return False
    return True


def lane_partial_sums(program: Program, lanes: int) -> Program:
    """`program` with every kernel `applies` takes split in two (the module docstring)."""
    kernels: list[Kernel] = []
    for k in program.kernels:
        kernels.extend(lane_partial_kernels(k, lanes) if applies(k, lanes) else (k,))
    out = dataclasses.replace(program, kernels=tuple(kernels))
    out.verify()
    return out


__all__ = ["applies", "lane_partial_kernels", "lane_partial_sums"]
