"""The workload registry behind `dataflow simulate --workload NAME` and `dataflow.simulate(NAME)`.

A workload module registers itself on import with `register(Workload(...))`. `WORKLOAD_TABLE`
names every workload with the module that registers it, its one-line help and its parameters,
so the CLI builds its flags and `get(name)` imports only that one workload's module: listing the
workloads imports none of them (start-up, issue 14). `tests/test_workload_table.py` checks that
the table says what the modules register. A workload's `run` takes the architecture, the engine
name, the seed and its own declared parameters, and returns a `SimResult` whose
`values_match_reference` and `max_abs_error` are already filled in.

Parameters are declared with `Param`; the CLI turns the union of all workloads' parameters
into flags (`--seq`, `--top-k`, ...) and passes a workload only the ones it declares, so a flag
given to a workload that does not take it is an error that names the flag.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dataflow.arch.limits import gib, memory_budget_bytes, shown
from dataflow.errors import UserError


@dataclass(frozen=True)
class Param:
    name: str  # python name; the CLI flag is --name with "_" -> "-"
    type: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def coerce(self, value: Any) -> Any:
        """`value` as this parameter's declared type: what the CLI would make of the same text
        (`"32"` -> 32), an integral float as an int (`32.0` -> 32); floats must be finite.
        Anything else raises a `UserError` naming the parameter. None (a default) stays."""
        if value is None:
            return None
        where = f"{self.flag} (parameter {self.name!r})"
        if self.type is int:
            if isinstance(value, bool):
                raise UserError(f"{where} must be an integer, got {value!r}")
            if isinstance(value, float) and value.is_integer():
                return int(value)
            try:
                if isinstance(value, (int, str)) or hasattr(value, "__index__"):
                    return int(value)
            except ValueError:
                pass
            raise UserError(f"{where} must be an integer, got {shown(value)}")
        if self.type is float:
            try:
                out = float(value) if not isinstance(value, bool) else None
            except (TypeError, ValueError):
                out = None
            if out is None:
                raise UserError(f"{where} must be a number, got {shown(value)}")
            if not math.isfinite(out):
                raise UserError(f"{where} must be a finite number, got {shown(value)}")
            return out
        if self.type is str and not isinstance(value, str):
            raise UserError(f"{where} must be a string, got {shown(value)}")
        return value


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[..., Any]  # run(spec, *, engine, seed, **params) -> SimResult
    params: tuple[Param, ...] = field(default=())
    help: str = ""

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Declared parameters with defaults filled in; unknown names raise ValueError."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            flags = ", ".join("--" + u.replace("_", "-") for u in unknown)
            raise UserError(f"workload {self.name!r} does not take {flags}; it takes "
                             + (", ".join(p.flag for p in self.params) or "no parameters"))
        out = {}
        for p in self.params:
            v = p.coerce(given.get(p.name, p.default))
            if p.choices is not None and v not in p.choices:
                raise UserError(f"{p.flag} must be one of {p.choices}, got {v!r}")
            out[p.name] = v
        return out


@dataclass(frozen=True)
class WorkloadInfo:
    """A workload as the registry knows it before its module is imported."""

    name: str
    module: str  # the module whose import registers it
    help: str
    params: tuple[Param, ...]


# Parameters several workloads declare alike
_M = Param("m", int, 256, "rows of A and C")
_K = Param("k", int, 256, "columns of A, rows of B")
_N = Param("n", int, 64, "columns of B and C (butterfly/fft: transform length)")
_MATMUL = (_M, _K, _N, Param("density", float, 0.05, "density of sparse A (spmm)"),
           Param("dataflow", str, None, "systolic dataflow (systolic architectures only; "
                 "default os)", choices=(None, "os", "ws", "is")))
_SEQ = Param("seq", int, 128, "sequence length (queries = keys)")
_TOKENS = Param("tokens", int, 64, "tokens (rows of X)")
_WIDTH = Param("dim", int, 64, "model width (columns of X)")
_MICRO_TILES = ("32x1", "1x64", "32x64")
_BATCH = Param("batch", int, 32, "butterfly/fft: vectors transformed at once")
_ORCH = Param("orchestration", str, "multilayer", "butterfly stages: layer (DRAM round trip per "
              "stage), fused (several stages per kernel), multilayer (stage kernels co-resident)",
              choices=("layer", "fused", "multilayer"))

#: Every workload, in the order the CLI lists them: its name, the module that registers it, its
#: help and its parameters (what `tests/test_workload_table.py` checks the module registers).
WORKLOAD_TABLE: tuple[WorkloadInfo, ...] = (
    WorkloadInfo("gemm", "dataflow.matmul_workloads", "dense C = A @ B", _MATMUL),
    WorkloadInfo("spmm", "dataflow.matmul_workloads", "CSR A @ dense B", _MATMUL),
    WorkloadInfo("attention", "dataflow.attention.api",
                 "masked attention, pattern as a UST mask: SDDMM -> softmax -> SpMM", (
        Param("pattern", str, "window", "attention sparsity pattern",
              choices=("dense", "window", "dilated", "bigbird", "butterfly", "nm")),
        _SEQ,
        Param("dim", int, 32, "head dimension d of q, k and v"),
        Param("window", int, None, "window half-width in keys (window, dilated; default 8)"),
        Param("dilation", int, None, "stride between attended keys (dilated; default 2)"),
        Param("block", int, None, "block edge in tokens (bigbird; default 16)"),
        Param("global_blocks", int, None, "global blocks (bigbird; default 1)"),
        Param("window_blocks", int, None, "block-band half-width (bigbird; default 1)"),
        Param("random_blocks", int, None, "random blocks per block row (bigbird; default 1)"),
        Param("nm", str, None, "N:M kept keys (nm; default 2:4)"),
        Param("lowering", str, "default", "attention lowering: csr (any pattern), dia (window, "
              "dilated: affine, no gathers), block (bigbird: gathered GEMMs over the kept "
              "blocks; window: over the blocks it touches, fillers masked), auto, default (block "
              "where the mask is whole blocks, not all of them, or enough of its touched blocks "
              "is attended, else csr)", choices=("csr", "dia", "block", "auto", "default")))),
    WorkloadInfo("dynamic-spmm", "dataflow.dynamic.workloads",
                 "C = A @ B, A's sparsity found at run time (PIT micro-tiles vs block-sparse)", (
        _M, _K, _N,
        Param("sparsity", float, 0.9, "fraction of zeros, in [0, 1) (dynamic-spmm: of A; "
              "relu-ffn: of the hidden neurons that are dead)"),
        Param("granularity", str, "32x1", "micro-tile the kernel gathers (32x1, 1x64: PIT; "
              "32x64: block-sparse; dense: GEMM baseline)", choices=(*_MICRO_TILES, "dense")),
        Param("mask_granularity", str, None, "how A's zeros are laid out (element, or whole "
              "micro-tiles; default: the --granularity, as in PIT's micro-benchmark)",
              choices=(None, "element", *_MICRO_TILES)))),
    WorkloadInfo("relu-ffn", "dataflow.dynamic.workloads",
                 "Y = ReLU(X W1 + b) W2, the second layer on dynamically sparse activations", (
        _TOKENS,
        Param("dim", int, 64, "model width (columns of X and Y)"),
        Param("hidden", int, 256, "hidden width (relu-ffn: of the FFN; moe: of each expert's "
              "output)"),
        Param("sparsity", float, 0.9, "fraction of zeros, in [0, 1)"),
        Param("granularity", str, "32x1", "micro-tile of the second layer's gathers",
              choices=(*_MICRO_TILES, "dense")))),
    WorkloadInfo("moe", "dataflow.moe",
                 "mixture of experts: top-k gating, dispatch, per-expert GEMMs, combine", (
        Param("experts", int, 8, "experts (moe)"),
        Param("top_k", int, 2, "experts per token, <= --experts (moe)"),
        _TOKENS, _WIDTH,
        Param("hidden", int, 64, "output width of each expert / the FFN's hidden width"),
        Param("skew", float, 0.0, "gate bias -skew * e: > 0 sends more tokens to low experts "
              "(moe)"),
        Param("placement", str, "grouped", "experts as one grouped kernel, side by side in "
              "array regions, or one after another (moe)",
              choices=("grouped", "parallel", "sequential")))),
    WorkloadInfo("butterfly", "dataflow.butterfly.workloads",
                 "butterfly matrix (log2 n stages of 2x2 factors) times a batch of vectors", (
        _N, _BATCH, _ORCH,
        Param("complex", int, 0, "butterfly: 1 for complex factors (0: real)", choices=(0, 1)))),
    WorkloadInfo("fft", "dataflow.butterfly.workloads",
                 "FFT along the last axis as butterfly stages (bit-reversed addressing)",
                 (_N, _BATCH, _ORCH)),
    WorkloadInfo("fnet-attention", "dataflow.butterfly.workloads",
                 "FNet/FABNet token mixing Re(FFT2) over (seq, dim)", (_SEQ, _WIDTH, _ORCH)),
)
_TABLE = {w.name: w for w in WORKLOAD_TABLE}
#: The modules that register workloads, each imported the first time one of its workloads is
#: asked for (`get`), or all of them by `workloads()`.
WORKLOAD_MODULES: tuple[str, ...] = tuple(dict.fromkeys(w.module for w in WORKLOAD_TABLE))

_REGISTRY: dict[str, Workload] = {}


def register(w: Workload) -> Workload:
    _REGISTRY[w.name] = w
    return w


def _declared() -> dict[str, WorkloadInfo | Workload]:
    """Every workload by name, none imported: the table's, then any registered outside it."""
    out: dict[str, WorkloadInfo | Workload] = dict(_TABLE)
    for name, w in _REGISTRY.items():
        out.setdefault(name, w)
    return out


def workload_names() -> tuple[str, ...]:
    """The workloads' names, in the table's order (importing no workload module)."""
    return tuple(_declared())


def workload_help(name: str) -> str:
    return _declared()[name].help


def workload_params(name: str) -> tuple[Param, ...]:
    """The parameters `name` declares (importing no workload module)."""
    return _declared()[name].params


def get(name: str) -> Workload:
    """The registered workload `name`; imports its module (only that one) the first time."""
    info = _TABLE.get(name)
    if name not in _REGISTRY and info is not None:
        importlib.import_module(info.module)
        if name not in _REGISTRY:
            raise RuntimeError(f"{info.module} registers no workload {name!r}: "
                               "dataflow.workloads.WORKLOAD_TABLE disagrees with it")
    if name not in _REGISTRY:
        raise UserError(f"unknown workload {name!r}; choose one of {sorted(_declared())}")
    return _REGISTRY[name]


def workloads() -> dict[str, Workload]:
    """Every workload, registered: imports every workload module (the table's order first)."""
    out = {name: get(name) for name in _TABLE}
    out.update(_REGISTRY)
    return out


def all_params() -> dict[str, Param]:
    """Union of every workload's parameters by name (first declaration gives the flag's type);
    from the table, so importing no workload module."""
    out: dict[str, Param] = {}
    for w in _declared().values():
        for p in w.params:
            out.setdefault(p.name, p)
    return out


def host_budget() -> float:
    """The bytes `check_host_memory` allows (infinite when the host's memory is unknown)."""
    return float(memory_budget_bytes() or math.inf)


def fits_host_memory(nbytes: float) -> bool:
    """Whether `nbytes` fit the host's memory budget (`check_host_memory` without the error)."""
    return nbytes <= host_budget()


def check_host_memory(what: str, nbytes: float) -> None:
    """Refuse, before allocating, operands and results of `nbytes` bytes that would not fit the
    host's memory budget (`dataflow.limits.memory_budget_bytes`); a `UserError` naming both."""
    budget = memory_budget_bytes()
    if budget and nbytes > budget:
        raise UserError(f"{what} need {gib(nbytes)} of host memory; the limit is {gib(budget)} "
                        "(a quarter of the memory available on this machine): use smaller sizes")


def dense_bytes(*shapes: tuple[int, ...], itemsize: int = 4) -> int:
    """Bytes of dense arrays of these shapes (fp32 unless `itemsize` says otherwise)."""
    return sum(math.prod(int(d) for d in s) for s in shapes) * itemsize


def finish(res, reference, t0: float, mapping=None):
    """Fill a `SimResult`'s value check and wall time (the helper every workload's run uses)."""
    # numpy's comparisons, imported here: listing the workloads (the CLI's flags) needs no numpy
    from dataflow.testing import max_abs_error, values_match

    return dataclasses.replace(
        res, values_match_reference=values_match(res.output, reference),
        max_abs_error=max_abs_error(res.output, reference),
        wall_seconds=time.perf_counter() - t0,
        mapping_summary=mapping.summary() if mapping is not None else res.mapping_summary)
