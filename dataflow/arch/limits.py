"""Limits on what a user may ask for, refused up front instead of hanging or running out of
memory (docs/conventions.md#limits). It imports nothing from `dataflow`, so the loader, the
workloads and the API share it; it sits in `dataflow.arch` so the plan caches' code fingerprint
covers the array limits.

The array sizes are what the mapper handles in reasonable time (benchmarks/bench_mapper_scale.py,
2 cores). Mapping grows with the PEs a kernel uses, not the PEs the array has (hop counts in
closed form, placement near the producers, copy counts tried best first): a 32 x 32 x 32 GEMM
maps onto a reconfigurable 64 x 64 array in 0.03 s and onto 256 x 256 in 0.4 s (before: 7 s on
32 x 32, over 3 minutes on 64 x 64), and the workloads of the mapper corpus (benchmarks/
bench_engine.py section 3) plan and simulate on 256 x 256 in 0.3 to 3 s each. Beyond that the
per-array work left (a ResMII for each of PEs / nodes copy counts) takes over: attention takes
about 35 s on 1024 x 1024. The systolic mapping is analytic and 1024 x 1024 takes
milliseconds. The YAML bounds keep an alias bomb from expanding, and `shown` keeps any value
echoed in an error message short.
"""

from __future__ import annotations

import os
import reprlib

#: largest pe_array.rows and pe_array.cols of a reconfigurable (modulo-scheduled) array
MAX_RECONFIGURABLE_SIDE = 256
#: largest pe_array.rows and pe_array.cols of a systolic array
MAX_SYSTOLIC_SIDE = 1024
#: largest spm.lines and pe_array.simd_lanes
MAX_SPM_LINES = 1024
MAX_SIMD_LANES = 1024
#: most YAML nodes (scalars, lists, mappings) a file may expand to once aliases are followed
MAX_YAML_NODES = 100_000
#: longest value text an error message echoes
MAX_SHOWN_CHARS = 80
#: share of the host's memory that operands and results may take (the rest: the simulator's
#: own arrays, the numpy reference's float64 copies, everything else running)
HOST_MEMORY_FRACTION = 0.25
#: a run split into tiles (docs/conventions.md#tiling-any-problem-size) checks every tile's
#: values in numpy (fp32 in k order, and a float64 reference): at most this many MACs, about
#: two minutes at the ~1e9 MACs/s measured on a 2-core host
MAX_HOST_CHECK_MACS = 10**11
#: ... and simulates at most this many MACs in the engine (a memoised tile counted once):
#: about five minutes at the fast engine's ~1e7 MACs/s (a 32640 x 64 x 64 GEMM tile in 12 s)
MAX_SIMULATED_MACS = 3 * 10**9
#: host bytes the mapper and the fast engine hold per iteration of a kernel's domain while they
#: map and run it (measured 84-91 B on gemm and spmm kernels of 4M-26M iterations); a matmul
#: whose simulation would not fit the host's memory is split into M tiles that do
HOST_BYTES_PER_ITERATION = 128
#: a split run keeps the whole result C when it takes at most this many bytes; a larger one
#: is checked tile by tile and not kept, so host memory stays proportional to a tile
MAX_KEPT_OUTPUT_BYTES = 2**28

_repr = reprlib.Repr()
_repr.maxstring = MAX_SHOWN_CHARS
_repr.maxother = MAX_SHOWN_CHARS
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxlevel = 3


def shown(value: object) -> str:
    """`repr(value)` cut to about `MAX_SHOWN_CHARS` characters (nested containers elided), for
    error messages: never expands a large or self-sharing structure."""
    text = _repr.repr(value)
    if len(text) > MAX_SHOWN_CHARS + 10:
        text = text[:MAX_SHOWN_CHARS] + "..."
    return text


def cut(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text` on one line, cut to `limit` characters (a key or a parser message echoed in an
    error)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def host_memory_bytes() -> int:
    """Physical memory of this machine in bytes (MemAvailable of /proc/meminfo where there is
    one, else the physical pages); 0 when it cannot be told."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0


def memory_budget_bytes() -> int:
    """Bytes operands and results may take: `HOST_MEMORY_FRACTION` of `host_memory_bytes`."""
    return int(host_memory_bytes() * HOST_MEMORY_FRACTION)


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB"
