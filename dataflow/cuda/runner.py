"""Launching kernels and timing them with CUDA events.

Every host function in `dataflow.cuda.ops` launches through a `Runner`. A plain runner just
launches. `measure(op, ...)` runs an op once untimed (JIT compilation, first-touch), then
`repeats` times with a CUDA event pair around each launch, and reports the median over repeats of
the summed kernel times, with FLOP/s and bandwidth from the op's FLOPs and compulsory bytes
(each operand read once, each result written once: what the kernel could not avoid moving).

Under the CUDA simulator there is no GPU time: `seconds` is None and `mode` is "cudasim", and
nothing downstream may present a simulator run as a measurement.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from dataflow.cuda.device import cuda_module, device_name, on_simulator
from dataflow.errors import UserError


@dataclass(frozen=True)
class KernelLaunch:
    """One launch: grid and block shape, FLOPs and compulsory bytes; `seconds` from CUDA
    events (None when untimed or on the simulator)."""

    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    flops: int
    bytes: int
    seconds: float | None = None


@dataclass(frozen=True)
class OpTiming:
    """An op's measured GPU time (median of `repeats`, kernels only, no host transfers)."""

    op: str
    mode: str  # "gpu" (CUDA events) or "cudasim" (no timing)
    device: str
    flops: int
    bytes: int
    repeats: int
    seconds: float | None
    launches: tuple[KernelLaunch, ...] = field(default=())

    @property
    def measured(self) -> bool:
        return self.mode == "gpu" and self.seconds is not None

    @property
    def flops_per_second(self) -> float | None:
        return self.flops / self.seconds if self.measured and self.seconds > 0 else None

    @property
    def bytes_per_second(self) -> float | None:
        return self.bytes / self.seconds if self.measured and self.seconds > 0 else None

    def summary(self) -> str:
        if not self.measured:
            return (f"{self.op}: ran in the CUDA simulator ({len(self.launches)} launches, "
                    f"{self.flops:,} FLOP, {self.bytes:,} B); no GPU time measured")
        return (f"{self.op}: {self.seconds * 1e6:,.1f} us measured on {self.device} "
                f"(median of {self.repeats}), {self.flops_per_second / 1e9:,.2f} GFLOP/s, "
                f"{self.bytes_per_second / 1e9:,.2f} GB/s, {len(self.launches)} launches")

    def to_dict(self) -> dict:
        return {"op": self.op, "mode": self.mode, "device": self.device, "flops": self.flops,
                "bytes": self.bytes, "repeats": self.repeats, "seconds": self.seconds,
                "measured": self.measured, "flops_per_second": self.flops_per_second,
                "bytes_per_second": self.bytes_per_second,
                "launches": [{"kernel": x.kernel, "grid": list(x.grid), "block": list(x.block),
                              "flops": x.flops, "bytes": x.bytes, "seconds": x.seconds}
                             for x in self.launches]}


_JIT: dict = {}


def jit(fn):
    """`cuda.jit(fn)`, once per function (the dispatcher compiles per argument types)."""
    if fn not in _JIT:
        _JIT[fn] = cuda_module().jit(fn)
    return _JIT[fn]


class Runner:
    """Launches kernels; with `timed=True` (and a real GPU) records CUDA events around each.

    `execute=False` makes a dry run: each launch is recorded (grid, FLOPs, bytes) but not run,
    so the roofline model can cost an op at sizes the simulator could never run; the op's
    output is then meaningless."""

    def __init__(self, timed: bool = False, execute: bool = True):
        if timed and not execute:
            raise UserError("a dry run (execute=False) cannot be timed")
        self.timed = timed
        self.execute = execute
        self._pending: list[tuple[KernelLaunch, object, object]] = []

    def launch(self, name: str, fn, grid, block, args, *, flops: int = 0, bytes: int = 0):
        grid = tuple(int(g) for g in (grid if isinstance(grid, tuple) else (grid,)))
        block = tuple(int(b) for b in (block if isinstance(block, tuple) else (block,)))
        if any(g <= 0 for g in grid):  # nothing to do (an empty operand)
            return
        rec = KernelLaunch(name, grid, block, int(flops), int(bytes))
        if not self.execute:
            self._pending.append((rec, None, None))
            return
        kernel = jit(fn)
        if self.timed and not on_simulator():
            cuda = cuda_module()
            start, stop = cuda.event(), cuda.event()
            start.record()
            kernel[grid, block](*args)
            stop.record()
            self._pending.append((rec, start, stop))
        else:
            kernel[grid, block](*args)
            self._pending.append((rec, None, None))

    def launches(self) -> tuple[KernelLaunch, ...]:
        """The launches so far, with their event times (waits for the GPU)."""
        out = []
        for rec, start, stop in self._pending:
            if start is None:
                out.append(rec)
            else:
                stop.synchronize()
                out.append(KernelLaunch(rec.kernel, rec.grid, rec.block, rec.flops, rec.bytes,
                                        start.elapsed_time(stop) / 1e3))
        return tuple(out)


def dry_run(fn, *args, **kwargs) -> tuple[KernelLaunch, ...]:
    """The launches `fn(*args, runner=..., **kwargs)` would make, without running them."""
    r = Runner(execute=False)
    fn(*args, runner=r, **kwargs)
    return r.launches()


def measure(op: str, fn, *args, repeats: int = 5, **kwargs):
    """Run `fn(*args, runner=..., **kwargs)` once to warm up, then `repeats` times timed.

    Returns (output of the last run, `OpTiming`). FLOPs and bytes are the launches' sums."""
    if repeats < 1:
        raise UserError(f"repeats must be at least 1, got {repeats}")
    cuda_module()
    sim = on_simulator()
    out = fn(*args, runner=Runner(), **kwargs)
    times, launches = [], ()
    for _ in range(1 if sim else repeats):
        r = Runner(timed=True)
        out = fn(*args, runner=r, **kwargs)
        launches = r.launches()
        if not sim:
            times.append(sum(x.seconds for x in launches))
    return out, OpTiming(
        op=op, mode="cudasim" if sim else "gpu", device=device_name(),
        flops=sum(x.flops for x in launches), bytes=sum(x.bytes for x in launches),
        repeats=len(times) if times else 0, seconds=statistics.median(times) if times else None,
        launches=launches)
