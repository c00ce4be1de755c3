"""Cross-checking values (numpy vs sim vs cuda) and comparing costs (dataflow vs GPU).

`crosscheck(workload, ...)`: one set of operands through the numpy reference, the sim backend
and the CUDA kernels; the largest absolute error of each pair, judged with the project's fp32
tolerances (`dataflow.testing`). Without a GPU the kernels run in the CUDA simulator, and the
result says so.

`compare(workload, ..., gpus=[...])`: the dataflow array's simulated time and energy next to each
GPU's. A GPU's time is measured (CUDA events) when this machine has that GPU, else modelled
from its spec (`dataflow.cuda.roofline`); each number carries its label.

`compare_model(model, ..., gpus=[...])`: the same, layer by layer, for a whole model. A layer's
modelled GPU time is the roofline of one launch with the layer's FLOPs and compulsory bytes
(`layer_work`, from its kind and sizes, fp32); GEMM and attention layers are measured with the
CUDA kernels when this machine has the GPU, every other layer is modelled, and each row says
which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.attention.api import mask_csr
from dataflow.cuda import ops as cu
from dataflow.cuda import workloads as gw
from dataflow.cuda.device import device_name, execution_mode, have_gpu, host_launches
from dataflow.cuda.gpu_spec import GpuSpec, load_gpu
from dataflow.cuda.roofline import GpuCost, measured_cost, model_cost
from dataflow.cuda.runner import KernelLaunch, dry_run, measure
from dataflow.errors import UserError
from dataflow.models import Layer, LayerKind, ModelResult
from dataflow.models import simulate as simulate_model
from dataflow.models.ops import HOST_PASSES
from dataflow.testing import max_abs_error, values_match

# Deferred imports: matplotlib is imported where the comparison is drawn (start-up of the CLI).


def _values(x) -> np.ndarray:
    """Dense values of a backend's output (numpy, or a UST Tensor's stored values)."""
    if hasattr(x, "val") and hasattr(x, "tensor_format"):
        return np.asarray(x.val)
    return np.asarray(x)


@dataclass(frozen=True)
class PairError:
    pair: str  # "numpy vs sim"
    max_abs_error: float
    match: bool


@dataclass(frozen=True)
class Crosscheck:
    workload: str
    params: dict
    description: str
    arch: str
    cuda_mode: str  # "gpu" or "cudasim"
    cuda_device: str
    pairs: tuple[PairError, ...]
    sim_cycles: int

    @property
    def ok(self) -> bool:
        return all(p.match for p in self.pairs)

    def summary(self) -> str:
        where = (f"on {self.cuda_device}" if self.cuda_mode == "gpu" else
                 "in the CUDA simulator (NUMBA_ENABLE_CUDASIM=1: no GPU on this machine)")
        lines = [f"dataflow crosscheck: {self.workload} ({self.description})",
                 f"  sim   {self.arch}, {self.sim_cycles:,} cycles",
                 f"  cuda  ran {where}",
                 f"  {'pair':<16}{'max abs error':>15}  match (fp32 tolerance)"]
        lines += [f"  {p.pair:<16}{p.max_abs_error:>15.3g}  {'yes' if p.match else 'NO'}"
                  for p in self.pairs]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"workload": self.workload, "params": self.params,
                "description": self.description, "arch": self.arch,
                "cuda_mode": self.cuda_mode, "cuda_device": self.cuda_device,
                "sim_cycles": self.sim_cycles, "ok": self.ok,
                "pairs": [{"pair": p.pair, "max_abs_error": p.max_abs_error, "match": p.match}
                          for p in self.pairs]}


def crosscheck(workload: str, arch=None, *, seed: int = 0, **params) -> Crosscheck:
    """numpy, sim and cuda on the same operands; the largest error of each pair."""

    w = gw.get(workload)
    params = gw.resolve_params(workload, params)
    spec = resolve_arch(arch)
    ops = w.inputs(seed=seed, **params)
    out = {"numpy": _values(w.numpy(ops))}
    sim_out, res = w.sim(ops, spec)
    out["sim"] = _values(sim_out)
    out["cuda"] = _values(w.cuda(ops))
    pairs = []
    for x, y in (("numpy", "sim"), ("numpy", "cuda"), ("sim", "cuda")):
        # the first of each pair is the expected side (its magnitude scales the tolerance)
        pairs.append(PairError(f"{x} vs {y}", max_abs_error(out[y], out[x]),
                               values_match(out[y], out[x])))
    return Crosscheck(workload, params, w.describe(ops), spec.name, execution_mode(),
                      device_name(), tuple(pairs), int(res.cycles))


@dataclass(frozen=True)
class Comparison:
    """Dataflow (simulated) vs GPUs (measured or modelled) on one workload instance."""

    workload: str
    params: dict
    description: str
    arch: str
    dataflow_cycles: int
    dataflow_seconds: float
    dataflow_energy_joules: float
    gpus: tuple[GpuCost, ...]
    notes: tuple[str, ...] = field(default=())

    def speedup(self, gpu: GpuCost) -> float:
        """GPU time / dataflow time (> 1: the dataflow array is faster)."""
        return gpu.seconds / self.dataflow_seconds

    def energy_ratio(self, gpu: GpuCost) -> float:
        """GPU energy / dataflow energy (> 1: the dataflow array is more energy-efficient)."""
        return gpu.energy_joules / self.dataflow_energy_joules

    def summary(self) -> str:
        lines = [f"dataflow compare: {self.workload} ({self.description})",
                 f"  {'side':<22}{'time (us)':>14}{'energy (uJ)':>14}  source",
                 (f"  {'dataflow ' + self.arch:<22}{self.dataflow_seconds * 1e6:>14,.2f}"
                  f"{self.dataflow_energy_joules * 1e6:>14,.2f}  simulated "
                  f"({self.dataflow_cycles:,} cycles, cycle-level engine)")]
        for g in self.gpus:
            lines.append(f"  {'GPU ' + g.gpu:<22}{g.seconds * 1e6:>14,.2f}"
                         f"{g.energy_joules * 1e6:>14,.2f}  {g.label}"
                         + (f" ({g.bound}-bound roofline)" if g.time_source == "modelled" else ""))
        for g in self.gpus:
            lines.append(f"  vs {g.gpu}: speedup {self.speedup(g):,.2f}x, energy efficiency "
                         f"{self.energy_ratio(g):,.2f}x (GPU / dataflow, > 1 favours the "
                         f"dataflow array; GPU side {g.label})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"workload": self.workload, "params": self.params,
                "description": self.description, "arch": self.arch,
                "dataflow": {"cycles": self.dataflow_cycles, "seconds": self.dataflow_seconds,
                             "energy_joules": self.dataflow_energy_joules,
                             "source": "simulated"},
                "gpus": [dict(g.to_dict(), speedup=self.speedup(g),
                              energy_ratio=self.energy_ratio(g)) for g in self.gpus],
                "notes": list(self.notes)}


def gpu_cost(w, ops: dict, spec, *, measure_if_present: bool = True, repeats: int = 5,
             precision: str = "fp32") -> tuple[GpuCost, str | None]:
    """(cost, note): measured when this machine has `spec`'s GPU, else modelled from the
    launches the kernels would make (a dry run: nothing executes)."""

    note = None
    if measure_if_present and have_gpu():

        dev = device_name()
        if spec.matches_device(dev):
            _, timing = measure(w.name, w.cuda, ops, repeats=repeats)
            return measured_cost(spec, timing, precision), None
        note = f"{spec.name}: this machine's GPU is {dev}, not this one; its time is modelled"
    with host_launches():  # nothing runs: no numba-cuda needed
        launches = dry_run(w.cuda, ops)
    return model_cost(spec, launches, precision), note


def compare(workload: str, arch=None, gpus=("jetson_xavier_nx",), *, seed: int = 0,
            measure_if_present: bool = True, precision: str = "fp32", **params) -> Comparison:
    """Simulate `workload` on `arch` and cost it on each GPU of `gpus` (names or YAML paths)."""

    w = gw.get(workload)
    params = gw.resolve_params(workload, params)
    specs = [load_gpu(g) for g in gpus]
    if not specs:
        raise UserError("compare needs at least one GPU (--gpu NAME)")
    spec = resolve_arch(arch)
    ops = w.inputs(seed=seed, **params)
    _, res = w.sim(ops, spec)
    costs, notes = [], []
    for g in specs:
        cost, note = gpu_cost(w, ops, g, measure_if_present=measure_if_present,
                              precision=precision)
        costs.append(cost)
        if note:
            notes.append(note)
    if any(c.time_source == "modelled" for c in costs):
        notes.append("modelled GPU times are per-kernel rooflines (peak FLOP/s, peak bandwidth, "
                     "compulsory bytes) plus a launch overhead: a lower bound on the GPU's "
                     "time, so the dataflow speedups shown are lower bounds too")
    notes.append("GPU energy = board power x time (an upper bound on its draw); dataflow "
                 "energy = the simulator's per-action energy table")
    return Comparison(workload, params, w.describe(ops), spec.name, int(res.cycles),
                      float(res.time_seconds), float(res.energy_total_pj) * 1e-12,
                      tuple(costs), tuple(notes))


# --- a whole model, layer by layer ---------------------------------------------------------------

F32_BYTES = 4


def _conv_out(layer: Layer) -> tuple[int, int]:
    p, st = layer.size("padding", 0), layer.size("stride", 1)
    return ((layer.size("h") + 2 * p - layer.size("r")) // st + 1,
            (layer.size("w") + 2 * p - layer.size("s")) // st + 1)


def _pattern_scores(layer: Layer) -> int:
    seq, pattern = layer.size("seq"), layer.op or "dense"
    if pattern == "causal":
        return seq * (seq + 1) // 2
    pos, _, _ = mask_csr(pattern, seq)
    return int(pos[-1])


def layer_work(layer: Layer, output_words: int | None = None) -> tuple[int, int]:
    """(FLOPs, compulsory bytes) of one layer on a GPU in fp32, from its kind and sizes: each
    operand read once and each result written once. GEMM 2mkn; convolution 2 Ho Wo R S C K;
    attention per head 4 d per score of the pattern (Q K^T and P V) plus 3 per score (softmax);
    an element-wise op one FLOP per word per pass (`HOST_PASSES`); an embedding moves its
    rows; an MoE layer its gate GEMM and top_k expert GEMMs per token. `output_words` (the
    simulated output's size) sizes an element-wise output that differs from its input (a
    pool)."""
    k, size = layer.kind, layer.size
    if k == LayerKind.GEMM:
        b, m, kk, n = size("batch", 1), size("m"), size("k"), size("n")
        return 2 * b * m * kk * n, F32_BYTES * b * (m * kk + kk * n + m * n)
    if k == LayerKind.CONV2D:
        ho, wo = _conv_out(layer)
        c, kk, r, s = size("c"), size("k"), size("r"), size("s")
        flops = 2 * ho * wo * r * s * c * kk
        return flops, F32_BYTES * (size("h") * size("w") * c + r * s * c * kk + ho * wo * kk)
    if k == LayerKind.ATTENTION:
        heads, seq, d = size("heads", 1), size("seq"), size("head_dim")
        nnz = _pattern_scores(layer)
        flops = heads * nnz * (4 * d + 3)
        return flops, F32_BYTES * (heads * 4 * seq * d + nnz + seq + 1)
    if k == LayerKind.ELEMENTWISE:
        n = size("rows") * size("cols")
        out = n if output_words is None else output_words
        reads = len(dict.fromkeys(layer.inputs)) if layer.op in ("add", "mul") else 1
        return HOST_PASSES.get(layer.op, 1) * n, F32_BYTES * (reads * n + out)
    if k == LayerKind.EMBEDDING:
        t, d = size("tokens"), size("dim")
        return 0, F32_BYTES * (2 * t * d + t)
    if k == LayerKind.MOE:
        t, d, h = size("tokens"), size("dim"), size("hidden")
        e, top = size("experts"), size("top_k")
        flops = 2 * t * d * e + 2 * t * top * d * h
        return flops, F32_BYTES * (t * d + d * e + e * d * h + t * h)
    raise UserError(f"{layer.where}: no GPU cost model for layer kind {str(k)!r}")


def _layer_operands(layer: Layer, rng: np.random.Generator):
    """(CUDA host function, operands) to measure a GEMM or attention layer, else None."""
    if layer.kind == LayerKind.GEMM and layer.size("batch", 1) == 1:
        a = rng.standard_normal((layer.size("m"), layer.size("k"))).astype(np.float32)
        b = rng.standard_normal((layer.size("k"), layer.size("n"))).astype(np.float32)
        return (lambda runner=None: cu.gemm(a, b, runner=runner)), "gemm"
    if layer.kind == LayerKind.ATTENTION and layer.op not in ("causal",):
        seq, d, heads = layer.size("seq"), layer.size("head_dim"), layer.size("heads", 1)
        q, kk, v = (rng.standard_normal((heads, seq, d)).astype(np.float32) for _ in range(3))
        pos, crd, _ = mask_csr(layer.op or "dense", seq)

        def heads_one_by_one(runner=None):
            return [cu.sparse_attention(q[h], kk[h], v[h], pos, crd, runner=runner)
                    for h in range(heads)]
        return heads_one_by_one, "attention"
    return None


@dataclass(frozen=True)
class LayerComparison:
    """One layer: simulated on the array, and its cost on each GPU (labelled)."""

    name: str
    kind: str
    dataflow_cycles: int
    dataflow_seconds: float
    flops: int
    bytes: int
    gpus: tuple[GpuCost, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "flops": self.flops, "bytes": self.bytes,
                "dataflow": {"cycles": self.dataflow_cycles, "seconds": self.dataflow_seconds,
                             "source": "simulated"},
                "gpus": [dict(g.to_dict(), speedup=g.seconds / self.dataflow_seconds
                              if self.dataflow_seconds else None) for g in self.gpus]}


@dataclass(frozen=True)
class ModelComparison:
    """Dataflow (simulated) vs GPUs (measured or modelled) on a whole model, per layer."""

    model: str
    arch: str
    layers: tuple[LayerComparison, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def dataflow_seconds(self) -> float:
        return sum(x.dataflow_seconds for x in self.layers)

    def gpu_seconds(self, i: int) -> float:
        return sum(x.gpus[i].seconds for x in self.layers)

    def summary(self) -> str:
        gpus = [g.gpu for g in self.layers[0].gpus]
        head = f"  {'layer':<20} {'kind':<11} {'cycles':>11} {'dataflow us':>12}"
        head += "".join(f" {g[:16] + ' us':>19} {'source':>9}" for g in gpus)
        lines = [f"dataflow compare: model {self.model} on {self.arch}, per layer", head]
        for x in self.layers:
            row = (f"  {x.name[:20]:<20} {x.kind:<11} {x.dataflow_cycles:>11,} "
                   f"{x.dataflow_seconds * 1e6:>12,.3f}")
            row += "".join(f" {g.seconds * 1e6:>19,.3f} {g.time_source:>9}" for g in x.gpus)
            lines.append(row)
        total = f"  {'total':<20} {'':<11} {sum(x.dataflow_cycles for x in self.layers):>11,} "
        total += f"{self.dataflow_seconds * 1e6:>12,.3f}"
        total += "".join(f" {self.gpu_seconds(i) * 1e6:>19,.3f} {'':>9}"
                         for i in range(len(gpus)))
        lines.append(total)
        for i, g in enumerate(gpus):
            srcs = sorted({x.gpus[i].time_source for x in self.layers})
            lines.append(f"  vs {g}: speedup {self.gpu_seconds(i) / self.dataflow_seconds:,.2f}x "
                         f"(GPU / dataflow time, > 1 favours the dataflow array; GPU times "
                         f"{' and '.join(srcs)})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"model": self.model, "arch": self.arch,
                "dataflow_seconds": self.dataflow_seconds,
                "gpu_seconds": {g.gpu: self.gpu_seconds(i)
                                for i, g in enumerate(self.layers[0].gpus)},
                "layers": [x.to_dict() for x in self.layers], "notes": list(self.notes)}


def _layer_gpu_cost(layer: Layer, flops: int, nbytes: int, spec: GpuSpec, measure_now: bool,
                    rng: np.random.Generator, precision: str) -> GpuCost:
    run = _layer_operands(layer, rng) if measure_now else None
    if run is not None:
        fn, op = run
        _, timing = measure(f"{layer.name} ({op})", fn)
        return measured_cost(spec, timing, precision)
    return model_cost(spec, [KernelLaunch(layer.name, (1,), (1,), flops, nbytes)], precision)


def compare_model(model_or_file, arch=None, gpus=("jetson_xavier_nx",), *, seed: int = 0,
                  measure_if_present: bool = True, precision: str = "fp32",
                  attention_pattern: str | None = None, result: ModelResult | None = None,
                  **sizes) -> ModelComparison:
    """Simulate a model on `arch` (or take its `result`) and cost every layer on each GPU:
    measured with the CUDA kernels (GEMM, attention) when this machine has that GPU, else the
    roofline of the layer's FLOPs and bytes (`layer_work`), labelled "modelled"."""
    specs = [load_gpu(g) for g in gpus]
    if not specs:
        raise UserError("compare needs at least one GPU (--gpu NAME)")
    r = result if result is not None else simulate_model(
        model_or_file, arch=arch, seed=seed, attention_pattern=attention_pattern, **sizes)
    here = device_name() if measure_if_present and have_gpu() else None
    notes = []
    rows = []
    for lr in r.layers:
        out = lr.result.output
        flops, nbytes = layer_work(lr.layer, None if out is None else int(np.asarray(out).size))
        rng = np.random.default_rng(seed)
        costs = tuple(_layer_gpu_cost(lr.layer, flops, nbytes, g,
                                      here is not None and g.matches_device(here), rng,
                                      precision) for g in specs)
        rows.append(LayerComparison(lr.layer.name, str(lr.layer.kind), int(lr.result.cycles),
                                    float(lr.result.time_seconds), flops, nbytes, costs))
    for g in specs:
        if here is not None and not g.matches_device(here):
            notes.append(f"{g.name}: this machine's GPU is {here}, not this one; its time is "
                         "modelled")
    if any(c.time_source == "modelled" for x in rows for c in x.gpus):
        notes.append("modelled GPU times: one roofline launch per layer (peak FLOP/s, peak "
                     "bandwidth, the layer's FLOPs and compulsory fp32 bytes) plus a launch "
                     "overhead: a lower bound on the GPU's time, so speedups are lower bounds")
    if here is not None:
        notes.append("measured: GEMM and attention layers with the CUDA kernels (CUDA events, "
                     "median of 5); the other layer kinds have no kernel here and are modelled")
    return ModelComparison(r.model.name, r.arch, tuple(rows), tuple(notes))


def plot_comparison(cmp: Comparison, path) -> str:
    """Bar charts of time and energy, each bar labelled simulated / measured / modelled."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"dataflow\n{cmp.arch}"] + [f"{g.gpu}" for g in cmp.gpus]
    srcs = ["simulated"] + [g.time_source for g in cmp.gpus]
    esrcs = ["simulated"] + [g.energy_source for g in cmp.gpus]
    times = [cmp.dataflow_seconds * 1e6] + [g.seconds * 1e6 for g in cmp.gpus]
    energy = [cmp.dataflow_energy_joules * 1e6] + [g.energy_joules * 1e6 for g in cmp.gpus]
    colors = {"simulated": "tab:blue", "measured": "tab:green", "modelled": "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, vals, lab, ylab in ((axes[0], times, srcs, "time (us)"),
                                (axes[1], energy, esrcs, "energy (uJ)")):
        bars = ax.bar(range(len(vals)), vals, color=[colors[s] for s in lab])
        for b, s in zip(bars, lab):
            ax.annotate(s, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=8)
        ax.set_xticks(range(len(vals)), names, fontsize=8)
        ax.set_ylabel(ylab)
        ax.set_yscale("log")
    fig.suptitle(f"{cmp.workload}: {cmp.description}", fontsize=10)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return str(out)
