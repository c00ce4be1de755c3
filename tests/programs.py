"""Seeded generators of small programs for fidelity tests and the mapper corpus.

`random_program(seed)` builds a random loop nest (dense or CSR-sparse inner loop, optional SIMD
vector loop) whose body is a random DAG of arithmetic ops over affine loads and an optional
indirect gather, ending in an accumulate or a store; sometimes a second kernel consumes the
first's output. Every node reaches the output, so dead-code removal keeps the body intact.
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op

ARITH = (Op.ADD, Op.SUB, Op.MUL, Op.MAX, Op.MAC, Op.EXP, Op.ROUTE, Op.CONST)


def _dense_addr(vars_extents: list[tuple[str, int]]) -> tuple[Addr, int]:
    """Row-major address over the given (var, extent)s and the buffer size it spans."""
    terms, stride = [], 1
    for v, e in reversed(vars_extents):
        terms.append((v, stride))
        stride *= e
    return Addr(tuple(reversed(terms))), stride


def random_kernel(rng: np.random.Generator, name: str, inputs: dict[str, np.ndarray],
                  out_name: str, first_input: tuple[str, int] | None = None) -> Kernel:
    """One random kernel; input data for its buffers is added to `inputs`.

    `first_input` = (buffer, size) makes the kernel read an earlier kernel's output."""
    outer = int(rng.integers(1, 6))
    loops = [Loop("i", outer)]
    ext = {"i": outer}
    vector = rng.random() < 0.6
    if vector:
        ext["j"] = int(rng.integers(1, 13))
        loops.append(Loop("j", ext["j"]))
    sparse = rng.random() < 0.35
    domain = ()
    if sparse:
        counts = rng.integers(0, 4, size=outer)
        pos = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        loops.append(Loop("p", pos="P_pos", parent="i"))
        domain = (("P_pos", pos),)
        red = ("p", int(pos[-1]))
    else:
        ext["kk"] = int(rng.integers(1, 5))
        loops.append(Loop("kk", ext["kk"]))
        red = ("kk", ext["kk"])
    var_ext = [(lp.var, ext[lp.var]) for lp in loops if lp.is_dense] + ([red] if sparse else [])
    var_ext = [(v, max(e, 1)) for v, e in var_ext]
    nodes: list[Node] = []
    buffers: list[Buffer] = []

    def add(op, ins=(), **kw):
        nodes.append(Node(len(nodes), op, tuple(ins), **kw))
        return len(nodes) - 1

    values = []
    n_loads = int(rng.integers(1, 4))
    for b in range(n_loads):
        if b == 0 and first_input is not None:
            bname, size = first_input
            addr = Addr((), const=int(rng.integers(0, size)))  # one element of it, broadcast
            values.append(add(Op.LOAD, buffer=bname, addr=addr, name=f"ld{b}"))
            buffers.append(Buffer(bname, size))
            continue
        chosen = [ve for ve in var_ext if rng.random() < 0.7 or ve[0] == "i"]
        addr, size = _dense_addr(chosen)
        bname = f"{name}_X{b}"
        inputs[bname] = rng.standard_normal(size).astype(np.float32)
        buffers.append(Buffer(bname, size))
        values.append(add(Op.LOAD, buffer=bname, addr=addr, name=f"ld{b}"))
    if rng.random() < 0.35:  # an indirect gather through a loaded index (PIT's SRead)
        rows = int(rng.integers(1, 6))
        width = ext.get("j", 1)
        idx_addr, idx_size = _dense_addr([ve for ve in var_ext if ve[0] != "j"])
        iname, tname = f"{name}_idx", f"{name}_T"
        inputs[iname] = rng.integers(0, rows, size=idx_size).astype(np.int64)
        inputs[tname] = rng.standard_normal(rows * width).astype(np.float32)
        buffers += [Buffer(iname, idx_size), Buffer(tname, rows * width)]
        ix = add(Op.LOAD, buffer=iname, addr=idx_addr, name="idx")
        gaddr = Addr((("j", 1),) if vector else (), index_stride=width)
        values.append(add(Op.GATHER, (ix,), buffer=tname, addr=gaddr, name="gather"))
    for _ in range(int(rng.integers(1, 7))):
        op = ARITH[int(rng.integers(0, len(ARITH)))]

        def pick():
            return values[int(rng.integers(0, len(values)))]

        if op is Op.CONST:
            values.append(add(op, value=float(rng.integers(-2, 3)) / 2))
        elif op in (Op.EXP, Op.ROUTE):
            src = pick()
            if op is Op.EXP:  # keep exp's argument small: exp(x * 0.25)
                c = add(Op.CONST, value=0.25)
                src = add(Op.MUL, (src, c))
            values.append(add(op, (src,)))
        elif op is Op.MAC:
            values.append(add(op, (pick(), pick(), pick())))
        else:
            values.append(add(op, (pick(), pick())))
    # every value reaches the output: fold the unused ones in with adds
    used = {i for n in nodes for i in n.inputs}
    loose = [v for v in dict.fromkeys(values) if v not in used]  # values[-1] is always one
    acc = loose[0]
    for v in loose[1:]:
        acc = add(Op.ADD, (acc, v))
    if rng.random() < 0.6:
        out_vars = [ve for ve in var_ext if ve[0] in ("i", "j")]
        addr, size = _dense_addr(out_vars)
        out = add(Op.ACC, (acc,), buffer=out_name, addr=addr, name="C+=")
        carried = ((out, out, 1),)
    else:
        addr, size = _dense_addr(var_ext)
        out = add(Op.STORE, (acc,), buffer=out_name, addr=addr, name="C=")
        carried = ()
    buffers.append(Buffer(out_name, size, "output"))
    return Kernel(name=name, loops=tuple(loops), nodes=tuple(nodes), buffers=tuple(buffers),
                  vector_var="j" if vector else None, domain_arrays=domain, carried=carried)


def random_program(seed: int) -> Program:
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    k1 = random_kernel(rng, "k1", inputs, "C")
    kernels = [k1]
    outputs = [("C", (k1.buffer_map["C"].size,))]
    if rng.random() < 0.25:
        k2 = random_kernel(rng, "k2", inputs, "D", first_input=("C", k1.buffer_map["C"].size))
        kernels.append(k2)
        outputs = [("D", (k2.buffer_map["D"].size,))]
    prog = Program(name=f"random{seed}", kernels=tuple(kernels), inputs=tuple(inputs.items()),
                   outputs=tuple(outputs))
    return run_passes(prog)
