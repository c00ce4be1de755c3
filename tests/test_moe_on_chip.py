"""The grouped MoE's experts hand Yd to the combine in the SPM (`Buffer.fetch="on_chip"`)
and its gate keeps X's rows there for the experts (`fetch="keep"`;
docs/conventions.md#moe-buffers-handed-over-in-the-spm): values as numpy, never below the
floors, fewer DRAM bytes and cycles than the round trips through DRAM, X read once, a Yd too
large to hold whole refused by the mapper by name and handed over through DRAM instead, and
hand-overs paired and placed alike."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dataflow.arch import resolve_arch
from dataflow.dfg.graph import BufferFetch, DFGError
from dataflow.mapper.legality import check_mapping
from dataflow.mapper.map import map_kernel
from dataflow.mapper.mapping import MappingError
from dataflow.moe import make_moe_operands, moe_reference, simulate_moe
from dataflow.moe.gating import gate_logits, route
from dataflow.moe.grouped import compile_grouped, grouped_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.testing import assert_close
from tests.conftest import ARCH_DIR

EXPERTS, TOKENS, DIM, HIDDEN, TOP_K = 4, 64, 16, 64, 2


@pytest.fixture(scope="module")
def ops():
    x, wg, bias, w = make_moe_operands(EXPERTS, TOKENS, DIM, HIDDEN, 0.0, seed=1)
    return x, wg, bias, w, route(gate_logits(x, wg, bias), TOP_K)


def _yd_bytes(routing, arch) -> int:
    """Yd's bytes: each expert's rows padded to whole panels of 4, `HIDDEN` words each."""
    rows = int((-(-routing.tokens_per_expert // 4)).sum()) * 4
    return rows * HIDDEN * arch.word_bytes


def _kernel(res, name):
    return next(k for k in res.kernels if k.kernel == name)


@pytest.mark.parametrize("preset", ["default", "mlx_4x4"])
def test_values_and_floors_with_yd_on_chip(ops, preset):
    """Values equal numpy; the run and each kernel stay above their floors; the only bytes
    written are the results (Y and the gate's logits), and the combine's own DRAM floor leaves
    Yd out -- both fail if Yd went through DRAM."""
    x, wg, bias, w, routing = ops
    arch = resolve_arch(str(ARCH_DIR / f"{preset}.yaml"))
    res, _ = simulate_moe(x, wg, bias, w, TOP_K, arch)
    assert res.values_match_reference
    assert_close(res.output, moe_reference(x, wg, bias, w, TOP_K), dtype=np.float32)
    assert res.cycles >= res.roofline_cycles > 0
    for k in res.kernels:
        assert k.fraction_of_roofline <= 1.0, (k.kernel, k.roofline, k.span_cycles)
    assert res.dram_bytes_written == (TOKENS * HIDDEN + TOKENS * EXPERTS) * arch.word_bytes
    combine = _kernel(res, "combine")
    rows_of_choices = TOKENS * TOP_K  # row_of and gate, one word per choice each
    assert combine.roofline.dram_cycles == pytest.approx(
        2 * rows_of_choices * arch.word_bytes / arch.dram.bytes_per_cycle)


def test_handover_saves_dram_bytes_and_cycles(ops, default_arch):
    """Against the same program with Yd through DRAM: exactly Yd's bytes fewer written and
    read, and fewer cycles (no write-back behind the experts, no load before the combine)."""
    x, wg, bias, w, routing = ops
    runs = {oc: compile_grouped(x, wg, w, routing, default_arch, simulate_mapping, on_chip=oc)
            for oc in (True, False)}
    held, through = runs[True], runs[False]
    assert held.on_chip and not through.on_chip and held.note == ""
    assert_close(held.result.output, through.result.output)
    yd = _yd_bytes(routing, default_arch)
    assert through.result.dram_bytes_written - held.result.dram_bytes_written == yd
    assert through.result.dram_bytes_read - held.result.dram_bytes_read >= yd
    assert held.result.cycles < through.result.cycles
    # the combine starts on Yd where the experts left it: no DRAM wait for it
    assert _kernel(held.result, "combine").span_cycles < _kernel(
        through.result, "combine").span_cycles


def test_kept_x_is_read_from_dram_once(ops, default_arch):
    """The gate loads the experts' copy of X and leaves it in the SPM (`fetch="keep"`), the
    experts gather from it there: exactly X's bytes fewer read than when each loads its own,
    values as numpy, the run above its floors."""
    x, wg, bias, w, routing = ops
    mappings = {keep: compile_program(grouped_program(x, wg, w, routing, on_chip=True,
                                                      keep_x=keep), default_arch)
                for keep in (True, False)}
    runs = {keep: simulate_mapping(m) for keep, m in mappings.items()}
    assert_close(runs[True].output, moe_reference(x, wg, bias, w, TOP_K), dtype=np.float32)
    assert runs[False].dram_bytes_read - runs[True].dram_bytes_read == x.nbytes
    assert runs[True].cycles >= runs[True].roofline_cycles
    gate, experts, _ = mappings[True].kernels
    assert gate.allocation_map["X_rows"].base == experts.allocation_map["X_rows"].base == 0


def test_yd_too_large_is_refused_by_name_and_goes_through_dram(ops, default_arch):
    """An SPM of 16 x 600 words holds the DRAM variant's tiles but not Yd (8,448 words) whole
    beside X's rows: the mapper refuses the handover naming Yd, and `compile_grouped` hands
    it over through DRAM with a note saying so; values stay right."""
    x, wg, bias, w, routing = ops
    small = dataclasses.replace(default_arch, spm=dataclasses.replace(
        default_arch.spm, capacity_words_per_line=600))
    experts = grouped_program(x, wg, w, routing, on_chip=True).kernels[1]
    assert experts.buffer_map["Yd"].fetch == BufferFetch.ON_CHIP
    with pytest.raises(MappingError, match=r"held on chip for another kernel .*Yd=8448"):
        map_kernel(experts, small)
    got = compile_grouped(x, wg, w, routing, small, simulate_mapping)
    assert not got.on_chip and "X and Yd handed over through DRAM" in got.note
    assert_close(got.result.output, moe_reference(x, wg, bias, w, TOP_K), dtype=np.float32)
    assert got.result.dram_bytes_written > _yd_bytes(routing, small)
    res, _ = simulate_moe(x, wg, bias, w, TOP_K, small)
    assert any("X and Yd handed over through DRAM" in n for n in res.notes)


def test_handover_must_be_paired_and_placed_alike(ops, default_arch):
    """A kernel may read on chip only what the kernel before left there, and both hold it at
    the same SPM words (`Program.verify`, `legality.check_on_chip`)."""
    x, wg, bias, w, routing = ops
    prog = grouped_program(x, wg, w, routing, on_chip=True)
    gate, experts, combine = prog.kernels
    through = dataclasses.replace(experts, buffers=tuple(
        dataclasses.replace(b, fetch=BufferFetch.WHOLE) if b.name == "Yd" else b
        for b in experts.buffers))
    with pytest.raises(DFGError, match="reads 'Yd' on chip"):
        dataclasses.replace(prog, kernels=(gate, through, combine)).verify()
    got = compile_grouped(x, wg, w, routing, default_arch, simulate_mapping)
    kms = list(got.mapping.kernels)
    assert kms[1].allocation_map["Yd"].base == kms[2].allocation_map["Yd"].base
    moved = dataclasses.replace(kms[2], allocations=tuple(
        dataclasses.replace(a, base=a.base + default_arch.spm.words_per_row)
        if a.buffer == "Yd" else a for a in kms[2].allocations))
    with pytest.raises(MappingError, match="handed from 'experts' to 'combine'"):
        check_mapping(dataclasses.replace(got.mapping, kernels=(kms[0], kms[1], moved)))
