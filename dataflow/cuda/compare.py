"""Cross-checking values (numpy vs sim vs cuda) and comparing costs (dataflow vs GPU).

`crosscheck(workload, ...)`: one set of operands through the numpy reference, the sim backend
and the CUDA kernels; the largest absolute error of each pair, judged with the project's fp32
tolerances (`dataflow.testing`). Without a GPU the kernels run in the CUDA simulator, and the
result says so.

`compare(workload, ..., gpus=[...])`: the dataflow array's simulated time and energy next to each
GPU's. A GPU's time is measured (CUDA events) when this machine has that GPU, else modelled
from its spec (`dataflow.cuda.roofline`); each number carries its label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.cuda import workloads as gw
from dataflow.cuda.device import device_name, execution_mode, have_gpu, host_launches
from dataflow.cuda.gpu_spec import load_gpu
from dataflow.cuda.roofline import GpuCost, measured_cost, model_cost
from dataflow.cuda.runner import dry_run, measure
from dataflow.errors import UserError
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
