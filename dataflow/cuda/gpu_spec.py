"""GPU descriptions (the presets `gpus/NAME`: `dataflow/arch/presets/gpus/*.yaml`) -> `GpuSpec`,
validated.

Every error is one `GpuSpecError` naming the file and the key path (`peak_flops.fp32`): unknown
keys, missing keys, wrong types, impossible values. A number written `1.5e12` is a string to
YAML 1.1 (PyYAML); the error says to write `1.5e+12`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from dataflow.arch.load import read_yaml
from dataflow.arch.resolve import GPU_GROUP, preset_names, preset_path
from dataflow.errors import KeyPathError

PRECISIONS = ("fp64", "fp64_tensor", "fp32", "tf32_tensor", "fp16", "fp16_tensor",
              "bf16_tensor", "fp8_tensor", "int8_tensor")


class GpuSpecError(KeyPathError):
    """A bad GPU description: `source` is the file, `key_path` the dotted key."""


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet numbers of one GPU. FLOP/s per precision, bytes/s, watts, seconds."""

    name: str
    peak_flops: tuple[tuple[str, float], ...]  # (precision, FLOP/s), e.g. ("fp32", 19.5e12)
    memory_bandwidth_bytes_per_s: float
    power_w: float
    kernel_launch_s: float = 0.0
    vendor: str = ""
    compute_capability: str = ""
    clock_ghz: float | None = None
    memory_bytes: float | None = None
    device_name_contains: str = ""
    source: str = field(default="", compare=False)

    def peak(self, precision: str = "fp32") -> float:
        """Peak FLOP/s at `precision`; a clear error listing the ones the spec has."""
        table = dict(self.peak_flops)
        if precision not in table:
            raise GpuSpecError(self.source or self.name, f"peak_flops.{precision}",
                               f"no peak given for {precision!r}; this GPU lists "
                               f"{', '.join(table)}")
        return table[precision]

    def matches_device(self, device_name: str) -> bool:
        """Whether a GPU the driver calls `device_name` is this one (a measurement there counts
        for this spec)."""
        token = self.device_name_contains or self.name
        return token.lower() in device_name.lower()

    def ridge_flops_per_byte(self, precision: str = "fp32") -> float:
        """Arithmetic intensity above which the roofline is compute-bound (FLOP/byte)."""
        return self.peak(precision) / self.memory_bandwidth_bytes_per_s


_REQUIRED = {"name": str, "peak_flops": dict, "memory_bandwidth_bytes_per_s": float,
             "power_w": float}
_OPTIONAL = {"kernel_launch_s": float, "vendor": str, "compute_capability": str,
             "clock_ghz": float, "memory_bytes": float, "device_name_contains": str}


def _number(value, source: str, path: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            raise GpuSpecError(source, path, f"expected a number, got {value!r}") from None
        raise GpuSpecError(source, path, f"expected a number, got the string {value!r} (YAML "
                           "1.1 reads an exponent without a sign as text: write e.g. 1.5e+12)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GpuSpecError(source, path, f"expected a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise GpuSpecError(source, path, f"must be a positive finite number, got {value!r}")
    return v


def gpu_from_dict(data, source: str = "<dict>") -> GpuSpec:
    """Validate plain data (as read from YAML) into a `GpuSpec`."""
    if not isinstance(data, dict):
        raise GpuSpecError(source, "", f"expected a mapping, got {type(data).__name__}")
    allowed = {**_REQUIRED, **_OPTIONAL}
    for key in data:
        if key not in allowed:
            raise GpuSpecError(source, str(key), f"unknown key {key!r}; allowed keys: "
                               f"{', '.join(sorted(allowed))}")
    for key in _REQUIRED:
        if key not in data:
            raise GpuSpecError(source, key, "required key is missing")
    kw = {}
    for key, tp in allowed.items():
        if key not in data:
            continue
        v = data[key]
        if tp is float:
            kw[key] = _number(v, source, key, allow_zero=key == "kernel_launch_s")
        elif tp is str:
            if not isinstance(v, str) or not v:
                raise GpuSpecError(source, key, f"expected a non-empty string, got {v!r}")
            kw[key] = v
    peaks = data["peak_flops"]
    if not isinstance(peaks, dict) or not peaks:
        raise GpuSpecError(source, "peak_flops", "expected a mapping of precision -> FLOP/s, "
                           f"got {peaks!r}")
    table = []
    for prec, v in peaks.items():
        if prec not in PRECISIONS:
            raise GpuSpecError(source, f"peak_flops.{prec}", f"unknown precision {prec!r}; "
                               f"known: {', '.join(PRECISIONS)}")
        table.append((prec, _number(v, source, f"peak_flops.{prec}")))
    if "fp32" not in dict(table):
        raise GpuSpecError(source, "peak_flops.fp32", "required key is missing (the kernels "
                           "of dataflow.cuda are fp32)")
    return GpuSpec(peak_flops=tuple(table), source=source, **kw)


def load_gpu(name_or_path: str | Path) -> GpuSpec:
    """A GPU by preset name (`jetson_xavier_nx`, `a100`, `h200`, also written `gpus/h200` or
    `h200.yaml`) or by path to a YAML file (an existing file wins over a preset name)."""
    p = Path(name_or_path)
    if not p.is_file():
        name = str(name_or_path).removeprefix(f"{GPU_GROUP}/").removesuffix(".yaml")
        if name in available_gpus():
            p = preset_path(f"{GPU_GROUP}/{name}")
        elif p.suffix not in (".yaml", ".yml"):
            raise FileNotFoundError(f"unknown GPU {str(name_or_path)!r}; known GPUs: "
                                    f"{', '.join(available_gpus())} (or give a path to a "
                                    ".yaml file)")
        # else a path that is not there: read_yaml says it cannot read it

    return gpu_from_dict(read_yaml(p, GpuSpecError, "GPU file"), source=str(p))


def available_gpus() -> tuple[str, ...]:
    """The GPU presets' names, without the `gpus/` prefix."""
    return tuple(n.removeprefix(f"{GPU_GROUP}/") for n in preset_names(GPU_GROUP))
