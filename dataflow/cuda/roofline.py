"""GPU time and energy: modelled from a `GpuSpec`, or measured with CUDA events.

The model is a roofline per kernel launch: a launch of F FLOPs moving B compulsory bytes takes

    t = max(F / peak_flops[precision], B / memory_bandwidth) + kernel_launch_s

and an op takes the sum over its launches (kernels of one op run one after another). That is a
lower bound on what the kernels could achieve (peak clocks, perfect overlap, every byte moved
once), so a dataflow-vs-GPU speedup computed against it is a lower bound too. Energy is
`power_w * t` with the spec's board power: an upper bound on the GPU's draw. Measured times
(CUDA events on a real GPU) replace the modelled time, and energy is then still modelled from
the measured time, which every result says: `time_source` / `energy_source` are "modelled" or
"measured", never left for the reader to guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.cuda.gpu_spec import GpuSpec
from dataflow.cuda.runner import KernelLaunch, OpTiming
from dataflow.errors import UserError


@dataclass(frozen=True)
class GpuCost:
    """Time (s) and energy (J) of one op on one GPU, each labelled "modelled" or "measured"."""

    gpu: str
    seconds: float
    energy_joules: float
    time_source: str  # "modelled" (roofline of the spec) or "measured" (CUDA events)
    energy_source: str  # always "modelled" (power_w x time): no power meter is read
    flops: int
    bytes: int
    launches: int
    bound: str  # "compute", "memory", "mixed" (modelled) or "measured"
    precision: str = "fp32"

    @property
    def label(self) -> str:
        return f"{self.time_source} time, {self.energy_source} energy"

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "seconds": self.seconds, "energy_joules": self.energy_joules,
                "time_source": self.time_source, "energy_source": self.energy_source,
                "flops": self.flops, "bytes": self.bytes, "launches": self.launches,
                "bound": self.bound, "precision": self.precision}


def launch_seconds(spec: GpuSpec, launch: KernelLaunch, precision: str = "fp32") -> float:
    """Roofline time of one launch (seconds), launch overhead included."""
    return (max(launch.flops / spec.peak(precision),
                launch.bytes / spec.memory_bandwidth_bytes_per_s) + spec.kernel_launch_s)


def model_cost(spec: GpuSpec, launches, precision: str = "fp32") -> GpuCost:
    """Modelled time and energy of an op given its launches (`KernelLaunch`es: FLOPs, bytes)."""
    launches = tuple(launches)
    if not launches:
        raise ValueError("model_cost needs at least one kernel launch")
    peak, bw = spec.peak(precision), spec.memory_bandwidth_bytes_per_s
    seconds = sum(launch_seconds(spec, x, precision) for x in launches)
    kinds = {"compute" if x.flops / peak >= x.bytes / bw else "memory" for x in launches}
    return GpuCost(
        gpu=spec.name, seconds=seconds, energy_joules=spec.power_w * seconds,
        time_source="modelled", energy_source="modelled",
        flops=sum(x.flops for x in launches), bytes=sum(x.bytes for x in launches),
        launches=len(launches), bound=kinds.pop() if len(kinds) == 1 else "mixed",
        precision=precision)


def measured_cost(spec: GpuSpec, timing: OpTiming, precision: str = "fp32") -> GpuCost:
    """Cost from a CUDA-event measurement on this GPU; energy = power_w x measured time."""
    if not timing.measured:
        raise UserError(f"{timing.op} was not measured on a GPU ({timing.mode}); use "
                         "model_cost for a modelled time")
    if not spec.matches_device(timing.device):
        raise UserError(f"{timing.op} was measured on {timing.device!r}, not on {spec.name} "
                         f"(its spec expects a device named like "
                         f"{spec.device_name_contains or spec.name!r})")
    return GpuCost(
        gpu=spec.name, seconds=timing.seconds, energy_joules=spec.power_w * timing.seconds,
        time_source="measured", energy_source="modelled", flops=timing.flops,
        bytes=timing.bytes, launches=len(timing.launches), bound="measured",
        precision=precision)
