"""butterfly and fft over any batch (docs/conventions.md#butterfly-and-fft-over-any-batch).

The vectors of a batch are transformed independently, and the orchestrations already cut a
batch into blocks that fit the SPM; what did not fit was the host: `--batch 1000000 --n 1024`
needs 61 GiB of operands. So a batch whose operands exceed the host's memory budget is
streamed: blocks of `rows` vectors, each generated from the seed (`default_rng([seed, b0])`
for the block starting at vector b0; not the values one whole draw gives), run, checked
against its numpy reference and dropped, so the host holds one block. The factors (butterfly)
are drawn whole from `default_rng(seed)`. A block's run depends on its
shape alone (the same stages on the same addresses), so one representative per block size is
simulated and its cycles, bytes and energy are counted for every block of that size; the
others' values are their numpy reference. The roofline is the blocks' floors added (each
reads its vectors, and the factors, once).

One vector too long for the SPM (`--workload fft --n 1048576`) stays the orchestration's clear
error: cutting a transform would need a four-step (Bailey) FFT, not modelled.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.arch.limits import HOST_BYTES_PER_ITERATION, MAX_KEPT_OUTPUT_BYTES, gib
from dataflow.pe_array.simulate import sequence_results
from dataflow.plan.split import _repeat, check_limits
from dataflow.testing import max_abs_error, values_match
from dataflow.workloads import dense_bytes, fits_host_memory, host_budget

#: most words of one streamed block (a few MB: its simulation takes seconds)
MAX_BLOCK_WORDS = 2**18


def operand_bytes(rows: int, n: int) -> int:
    """Host bytes of `rows` vectors as the butterfly workloads count them (X and Y complex,
    four times over)."""
    return 4 * dense_bytes((rows, n), itemsize=16)


def block_rows(batch: int, n: int) -> int | None:
    """Vectors per streamed block, or None when the whole batch fits the host."""
    if fits_host_memory(operand_bytes(batch, n)):
        return None
    stages = max(1, int(n).bit_length() - 1)
    per_row = operand_bytes(1, n) + HOST_BYTES_PER_ITERATION * n * stages
    factors = 2 * dense_bytes((stages, n, 2), itemsize=16)  # 2 x 2 factors, complex, twice
    rows = min(batch, max(1, MAX_BLOCK_WORDS // n), int((host_budget() - factors) // per_row))
    return rows if rows >= 1 else None  # not even one vector: the whole run's check refuses


def stream_batch(workload: str, batch: int, n: int, seed: int, make_block, run_block,
                 reference) -> object | None:
    """Run `batch` vectors of length n in streamed blocks when they do not fit the host;
    None when they do. `make_block(rng, rows)` draws a block, `run_block(x)` returns
    (y, SimResult), `reference(x)` the block's numpy reference."""
    rows = block_rows(batch, n)
    if rows is None:
        return None
    t0 = time.perf_counter()
    stages = max(1, int(n).bit_length() - 1)
    work = 2.0 * batch * n * stages  # a 2 x 2 factor per pair of elements per stage
    distinct = 2 if batch % rows else 1
    check_limits(f"{workload} (--batch {batch} --n {n})", work, distinct * rows / batch * work)
    keep = batch * n * 8 <= MAX_KEPT_OUTPUT_BYTES
    output, memo, parts = None, {}, []
    ok, error, model_error = True, 0.0, 0.0
    for b0 in range(0, batch, rows):
        b1 = min(batch, b0 + rows)
        x = make_block(np.random.default_rng([seed, b0]), b1 - b0)
        expected = reference(x)
        if b1 - b0 in memo:
            y, res = expected, memo[b1 - b0]
        else:
            y, res = run_block(x)
            res = dataclasses.replace(res, output=None)
            memo[b1 - b0] = res
            model_error = max(model_error, max_abs_error(_ri(y), _ri(expected)))
        if parts and parts[-1][0] == b1 - b0:
            parts[-1][1] += 1
        else:
            parts.append([b1 - b0, 1])
        ok = ok and values_match(_ri(y), _ri(expected))
        error = max(error, max_abs_error(_ri(y), _ri(expected)))
        if keep:
            if output is None:
                output = np.zeros((batch, n), dtype=np.asarray(y).dtype)
            output[b0:b1] = y
    blocks = sum(c for _, c in parts)
    notes = (f"streamed (docs/conventions.md#butterfly-and-fft-over-any-batch): {batch:,} "
             f"vectors ({gib(operand_bytes(batch, n))} of operands) in {blocks:,} block(s) of "
             f"{rows:,}, each drawn from default_rng([seed, first vector]) (not the values one "
             "whole draw gives) and dropped once checked; the host holds one block",
             f"timing memoised: {len(memo):,} distinct block size(s) simulated, their cycles, "
             f"bytes and energy counted for all {blocks:,} blocks; the others' values are their "
             f"numpy reference; the simulated blocks' engine values lie within "
             f"{model_error:.3g} of it",
             f"values checked block by block against the numpy reference ({blocks:,} blocks)") \
        + (() if keep else (f"output not kept: Y ({gib(batch * n * 8)}) is larger than "
                            f"{gib(MAX_KEPT_OUTPUT_BYTES)}",))
    res = sequence_results([_repeat(memo[size], count) for size, count in parts], workload,
                           output, notes=notes)
    return dataclasses.replace(res, values_match_reference=ok, max_abs_error=error,
                               wall_seconds=time.perf_counter() - t0)


def _ri(z) -> np.ndarray:
    z = np.asarray(z)
    return np.stack([z.real, z.imag], -1) if np.iscomplexobj(z) else z


__all__ = ["block_rows", "stream_batch"]
