"""`Plan`: the value-independent half of an op (lowering + mapping), keyed for caching.

Planning is the expensive part of a `sim` run: the mapper modulo-schedules every kernel.
A mapping depends on the operands' formats, shapes and sparsity *structure* (pos/crd arrays:
they fix the iteration domain, the gather addresses and the tiling) and on the arch and
dataflow, never on the stored values. So a `Plan` keeps only the per-kernel mappings; to
execute, the op is lowered again with the current values (cheap) and the planned kernel
mappings are bound to that fresh program (`Plan.bind`).

The key is a sha256 over (op, backend, per operand: format, shape, dtype, structure hash,
arch as its YAML dict, dataflow); see `plan_key`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

from dataflow.arch.load import arch_to_dict
from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Program
from dataflow.errors import UserError
from dataflow.mapper.mapping import KernelMapping, Mapping, SystolicMapping
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import ProgramSchedule, apply_schedule, choose_schedule
from dataflow.plan.gather_lines import line_order


class PlanMismatchError(UserError):
    """A plan used with operands (or a program) other than the ones it was made for."""


@dataclass(frozen=True)
class OperandSignature:
    """What a plan depends on for one operand: format, shape, dtype, structure hash."""

    tensor_format: str
    shape: tuple[int, ...]
    dtype: str
    structure_sha256: str

    def text(self) -> str:
        return f"{self.tensor_format} {self.shape} {self.dtype} {self.structure_sha256[:12]}"


@dataclass(frozen=True, eq=False)
class Plan:
    """A planned op. `kernel_mappings` is empty for the numpy backend (nothing to map).

    Program-independent: it holds the mapper's decisions per kernel (placements, routes, II,
    tiles, SPM allocations), not the operand values; `bind(program)` attaches a program lowered
    from the current values. `plan_seconds` is the wall time the build took (lower + map).
    """

    key: str
    op: str
    backend: str
    operands: tuple[OperandSignature, ...]
    arch: ArchSpec | None
    dataflow: str | None
    kernel_mappings: tuple[KernelMapping | SystolicMapping, ...]
    program_name: str
    summary: str
    notes: tuple[str, ...] = ()
    plan_seconds: float = 0.0
    # the compiler's transformations (`dataflow.plan.compile`), re-applied to each program
    # lowered from new values; None: the program runs as lowered
    schedule: ProgramSchedule | None = None

    def bind(self, program: Program) -> Mapping:
        """The `Mapping` of this plan over `program` (same kernels, current values)."""
        if self.backend != "sim":
            raise PlanMismatchError(f"plan {self.key[:12]} is a {self.backend!r} plan; "
                                    "only 'sim' plans hold a mapping")
        program = apply_schedule(program, self.schedule, self.arch)
        names = [k.name for k in program.kernels]
        planned = [km.kernel.name for km in self.kernel_mappings]
        if names != planned or program.name != self.program_name:
            raise PlanMismatchError(
                f"plan {self.key[:12]} was made for program {self.program_name!r} with kernels "
                f"{planned}; got {program.name!r} with {names}")
        # a static sparse operand's nonzeros in the line-aware order, as `choose_schedule`
        return line_order(Mapping(program=program, arch=self.arch, kernels=self.kernel_mappings))

    def describe(self) -> str:
        arch = self.arch.name if self.arch else "-"
        lines = [(f"plan {self.key[:16]}  op={self.op} backend={self.backend} "
                  f"dataflow={self.dataflow or '-'} arch={arch} "
                  f"({self.plan_seconds * 1e3:.1f} ms to build)")]
        lines += [f"  operand {i}: {s.text()}" for i, s in enumerate(self.operands)]
        lines += ["  " + s for s in self.summary.splitlines()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def structure_hash(tensor) -> str:
    """sha256 of a UST tensor's format, shape and every level's pos/crd bytes (not its values)."""
    h = hashlib.sha256()
    h.update(str(tensor.tensor_format).encode())
    h.update(repr(tuple(tensor.shape)).encode())
    for lvl in range(tensor.num_levels):
        for tag, arr in (("pos", tensor.pos(lvl)), ("crd", tensor.crd(lvl))):
            if arr is None:
                continue
            a = np.ascontiguousarray(arr)
            h.update(f"{lvl}:{tag}:{a.dtype.str}:{a.size}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def signature(tensor) -> OperandSignature:
    return OperandSignature(str(tensor.tensor_format), tuple(tensor.shape), tensor.dtype.str,
                            structure_hash(tensor))


def arch_hash(arch: ArchSpec | None) -> str:
    """sha256 of the arch's YAML dict (stable across processes, unlike `hash(arch)`)."""
    if arch is None:
        return "-"

    d = arch_to_dict(arch)
    d.pop("source", None)  # where it was loaded from does not change the hardware
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def plan_key(op: str, backend: str, operands: tuple[OperandSignature, ...],
             arch: ArchSpec | None, dataflow: str | None, extra: str = "") -> str:
    text = json.dumps({
        "op": op, "backend": backend,
        "operands": [dataclasses.astuple(s) for s in operands],
        "arch": arch_hash(arch), "dataflow": dataflow, "extra": extra,
    }, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def build_plan(key: str, op: str, backend: str, operands: tuple[OperandSignature, ...],
               arch: ArchSpec | None, dataflow: str | None, lower=None,
               notes: tuple[str, ...] = ()) -> Plan:
    """Lower (`lower()` -> Program, sim only) and map: the expensive step a cache skips."""
    t0 = time.perf_counter()
    if backend != "sim":
        return Plan(key=key, op=op, backend=backend, operands=operands, arch=arch,
                    dataflow=dataflow, kernel_mappings=(), program_name="",
                    summary=f"{op} on the numpy reference: nothing to map", notes=notes,
                    plan_seconds=time.perf_counter() - t0)

    program = lower()
    mapping, schedule = choose_schedule(program, arch, dataflow=dataflow)
    return Plan(key=key, op=op, backend=backend, operands=operands, arch=arch,
                dataflow=dataflow, kernel_mappings=mapping.kernels, program_name=program.name,
                summary=mapping.summary(), notes=notes, plan_seconds=time.perf_counter() - t0,
                schedule=schedule)


def run_plan(plan: Plan, program: Program):
    """Simulate `program` (lowered from the current values) on the planned mapping."""

    return simulate_mapping(plan.bind(program), workload=plan.op)
