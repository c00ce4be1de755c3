"""The dynamic-sparsity workloads' plans through the plan cache (issue 14: planning out of the
warm path).

A dynamic-spmm program is lowered from A's run-time pattern, so its kernels (the index scan,
the compactions, the panel GEMMs) are fixed by which entries of A are zero, the shapes and the
lowering's options, never by the stored values. `planned_mapping` keys a `Plan` on exactly
that (A's zero mask, B's shape, the options, the lowered kernels' text, the arch) and fetches
it from the process's plan cache (memory, then `$DATAFLOW_CACHE_DIR`), building it with
`choose_schedule` on a miss; the program lowered from the current values is bound to it
(`Plan.bind`), as the attention workload's `SparseAttention.plan` does. The cycles and values
equal `compile_program`'s (tests/test_dynamic_panel.py).
"""

from __future__ import annotations

import hashlib

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Program
from dataflow.mapper.mapping import Mapping
from dataflow.ust_frontend.cache import PlanCache, default_cache
from dataflow.ust_frontend.plan import OperandSignature, build_plan, plan_key

#: the plan's op name (`Plan.op`, the key's first field)
OP = "dynamic-spmm"


def structure_signature(name: str, a: np.ndarray) -> OperandSignature:
    """What a dynamic program's plan depends on in operand `a`: its shape, dtype and zero mask
    (sha256 of the packed `a != 0` bits), not its values."""
    a = np.asarray(a)
    mask = np.packbits(np.ascontiguousarray(a != 0), axis=None)
    digest = hashlib.sha256(repr(a.shape).encode() + mask.tobytes()).hexdigest()
    return OperandSignature(f"dynamic {name}", tuple(a.shape), a.dtype.str, digest)


def shape_signature(name: str, b: np.ndarray) -> OperandSignature:
    """A dense operand whose values the plan never depends on: its shape and dtype only."""
    b = np.asarray(b)
    return OperandSignature(f"dense {name}", tuple(b.shape), b.dtype.str, "-")


def planned_mapping(program: Program, arch: ArchSpec, operands: tuple[OperandSignature, ...],
                    options: str, *, cache: PlanCache | None | bool = None
                    ) -> tuple[Mapping, str]:
    """(`program` bound to its plan, where the plan came from: "built", "memory" or "disk").

    `operands` and `options` (the lowering's choices as text) key the plan together with the
    program's kernels as text and `arch`; `cache`: a `PlanCache`, None for the process default,
    False to plan afresh (what `compile_program` does)."""
    shape = "\n".join([program.name, *(str(k) for k in program.kernels)])
    key = plan_key(OP, "sim", operands, arch, None,
                   extra=options + "\n" + hashlib.sha256(shape.encode()).hexdigest())

    def build():
        return build_plan(key, OP, "sim", operands, arch, None, lower=lambda: program)

    if cache is False:
        plan, source = build(), "built"
    else:
        plan, source = (default_cache() if cache is None else cache).get_or_build(key, build)
    return plan.bind(program), source


__all__ = ["OP", "planned_mapping", "shape_signature", "structure_signature"]
