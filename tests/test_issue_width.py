"""`pe_array.issue_width` (docs/architecture.md#issue-width): a PE issues up to that many ops a
cycle, each on a different functional unit.

- the arch loader refuses a bad value naming the key, and the field round-trips;
- `res_mii`'s PE issue bound is ceil(copies x nodes / (PEs x width)), the per-unit bound stays;
- legality refuses width + 1 ops in one (PE, slot) and two ops of one slot on one unit;
- the mapper packs several ops into one (PE, slot) when the width allows, and the reference
  stepper and the fast engine stay identical (every counter, values bit for bit, equal to
  numpy) on such mappings, on random programs and on the mlx_4x4 preset;
- utilisation divides by the width (stays in [0, 1]);
- the SpMM split's issue model gains from the width (and is unchanged at width 1).
"""

import dataclasses
import math
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.arch import ArchError, arch_from_dict, arch_to_dict, load_arch
from dataflow.dfg.lower import lower_spmm_csr
from dataflow.mapper import MappingError, map_program
from dataflow.mapper.bounds import issue_copies, res_mii, unit_busy
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.matmul_split import spmm_issue
from dataflow.pe_array.simulate import run_array
from dataflow.testing import assert_close
from tests.archs import default_dict, variant
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical
from tests.programs import random_program
from tests.test_knobs import _scale_store

SMALL = {"pe_array.rows": 2, "pe_array.cols": 2}


def _spmm(m=12, k=10, n=9, density=0.3, seed=2):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=rng)
    a.sort_indices()
    b = rng.standard_normal((k, n), dtype=np.float32)
    return lower_spmm_csr(a.shape, a.indptr, a.indices, a.data, b), a.toarray() @ b


def _packed(mapping) -> int:
    """The most ops any (PE, slot) of any kernel holds."""
    most = 0
    for km in mapping.kernels:
        held = Counter((p.pe, p.time % km.ii) for p in km.placements)
        most = max(most, *held.values())
    return most


# --- the knob ----------------------------------------------------------------------------------

def test_default_is_single_issue_and_mlx_is_four_wide():
    assert load_arch(ARCH_DIR / "default.yaml").pe_array.issue_width == 1
    assert load_arch(ARCH_DIR / "systolic_32x32.yaml").pe_array.issue_width == 1
    assert load_arch(ARCH_DIR / "mlx_4x4.yaml").pe_array.issue_width == 4


@pytest.mark.parametrize("value, words", [(0, "must be > 0"), (-2, "must be > 0"),
                                          (7, "at most 6"), ("two", "pe_array.issue_width")])
def test_bad_issue_width_is_refused_naming_the_key(value, words):
    d = default_dict()
    d["pe_array"]["issue_width"] = value
    with pytest.raises(ArchError, match="pe_array.issue_width") as err:
        arch_from_dict(d, source="t.yaml")
    assert words in str(err.value)


def test_issue_width_round_trips_and_keys_the_caches():
    a = variant(**{"pe_array.issue_width": 3})
    data = arch_to_dict(a)
    assert data["pe_array"]["issue_width"] == 3
    assert arch_from_dict(data).pe_array == a.pe_array
    one = variant()
    assert hash(one) != hash(a) and arch_to_dict(one) != data  # plan-cache keys differ


# --- mapper bounds and legality ----------------------------------------------------------------

@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("copies", [1, 3, 4, 8])
def test_res_mii_closed_form(width, copies):
    prog, _ = _spmm()
    kernel = prog.kernels[0]
    arch = variant(**SMALL, **{"pe_array.issue_width": width})
    pes = 4
    busy = unit_busy(kernel, arch)
    issue = math.ceil(copies * len(kernel.nodes) / (pes * width))
    unit = max(math.ceil(copies * b / pes) for b in busy.values())
    got = res_mii(kernel, arch, copies)
    assert got >= max(issue, unit)
    # the SPM ports do not bind here: the bound is exactly the issue and unit terms
    spm = arch.spm
    reads = sum(1 for n in kernel.nodes if n.op.reads_spm)
    if copies * reads <= spm.lines * spm.read_ports_per_line:
        assert got == max(1, issue, unit)


def test_res_mii_issue_term_falls_with_the_width_until_a_unit_binds():
    prog, _ = _spmm()
    kernel = prog.kernels[0]  # 5 nodes: 4 on the lsu, 1 on the multiplier
    assert len(kernel.nodes) == 5 and max(unit_busy(kernel, variant()).values()) == 4
    mii = [res_mii(kernel, variant(**SMALL, **{"pe_array.issue_width": w}), 4)
           for w in (1, 2, 4)]
    assert mii == [5, 4, 4]  # ceil(20 / 4), then the lsu: ceil(16 / 4)
    assert issue_copies(kernel, variant(**{"pe_array.issue_width": 1})) == 64 // 5
    assert issue_copies(kernel, variant(**{"pe_array.issue_width": 4})) == 64 // 4


def _scale_mapping(width: int):
    """A legal mapping of C = 2 A (load, const, mul, store: three units) on a 2 x 2 array, one
    copy."""
    prog = _scale_store(4, 16)
    arch = variant(**SMALL, **{"pe_array.issue_width": width})
    return map_program(prog, arch, copies=1).kernels[0], arch


def _moved(km, nids, pe, time):
    """`km` with nodes `nids` of copy 0 all placed on `pe` at `time`."""
    placements = tuple(dataclasses.replace(p, pe=pe, time=time) if p.node in nids else p
                       for p in km.placements)
    return dataclasses.replace(km, placements=placements)


def test_legality_refuses_more_ops_than_the_width_in_one_slot():
    km, arch = _scale_mapping(2)
    units = {n.id: arch.fu_for(n.op.value).name for n in km.kernel.nodes}
    distinct = {}
    for nid, unit in units.items():
        distinct.setdefault(unit, nid)
    assert len(distinct) >= 3, units
    three = list(distinct.values())[:3]
    with pytest.raises(MappingError, match=r"holds 3 ops.*issue_width = 2"):
        check_kernel_mapping(_moved(km, three, (0, 0), km.ii * 5), arch)
    # two of them, on different units, on a PE whose slot holds nothing else, pass the issue
    # check (whatever the routes then say)
    others = Counter((p.pe, p.time % km.ii) for p in km.placements if p.node not in three[:2])
    pe = next(q for q in ((r, c) for r in range(2) for c in range(2)) if not others[(q, 0)])
    try:
        check_kernel_mapping(_moved(km, three[:2], pe, km.ii * 5), arch)
    except MappingError as exc:
        assert "holds" not in str(exc) and "busy in slot" not in str(exc)


def test_legality_refuses_two_ops_on_one_unit_at_any_width():
    km, arch = _scale_mapping(4)
    by_unit: dict = {}
    for n in km.kernel.nodes:
        by_unit.setdefault(arch.fu_for(n.op.value).name, []).append(n.id)
    pair = next(ids[:2] for ids in by_unit.values() if len(ids) >= 2)
    with pytest.raises(MappingError, match="busy in slot"):
        check_kernel_mapping(_moved(km, pair, (1, 1), km.ii * 5), arch)


def test_single_issue_still_refuses_two_ops_in_a_slot():
    km, arch = _scale_mapping(1)
    units: dict = {}
    for n in km.kernel.nodes:
        units.setdefault(arch.fu_for(n.op.value).name, n.id)
    a, b = list(units.values())[:2]  # on two different units: only the width refuses them
    with pytest.raises(MappingError, match="holds two ops"):
        check_kernel_mapping(_moved(km, [a, b], (0, 0), km.ii * 5), arch)


# --- engines -----------------------------------------------------------------------------------

WIDE = {
    "2x2-w2": {**SMALL, "pe_array.issue_width": 2},
    "2x2-w4-1port": {**SMALL, "pe_array.issue_width": 4, "spm.read_ports_per_line": 1},
    "4x4-w3": {"pe_array.rows": 4, "pe_array.cols": 4, "pe_array.issue_width": 3},
}


@pytest.mark.parametrize("seed", range(0, 30, 2))
def test_engines_identical_on_random_programs_at_width_above_one(seed):
    name = list(WIDE)[seed % len(WIDE)]
    arch = variant(**WIDE[name])
    mapping = map_program(random_program(seed), arch)
    res = assert_engines_identical(mapping)
    assert 0.0 <= res.pe_utilization <= 1.0


@pytest.mark.parametrize("width", [2, 4])
def test_packed_slots_run_identically_and_equal_numpy(width):
    """A mapping with several ops in one (PE, slot): both engines identical, values equal
    numpy, and a PE issues more ops than there are cycles while utilisation stays <= 1."""
    prog, expected = _spmm(20, 16, 8, 0.3)
    arch = variant(**SMALL, **{"pe_array.issue_width": width})
    mapping = map_program(prog, arch)
    assert _packed(mapping) > 1
    res = assert_engines_identical(mapping)
    (fast,) = run_array(mapping, "fast")
    assert_close(dict(fast.outputs)["C"].reshape(expected.shape), expected)
    assert res.pe_busy_cycles.max() > res.cycles or res.pe_utilization <= 1.0
    assert 0.0 < res.pe_utilization <= 1.0
    single = variant(**SMALL)
    assert res.pe_utilization == pytest.approx(
        res.pe_busy_cycles.sum() / (4 * width * res.cycles))
    assert single.pe_array.issue_width == 1


def test_engines_identical_on_the_mlx_preset():
    arch = load_arch(ARCH_DIR / "mlx_4x4.yaml")
    prog, expected = _spmm(24, 32, 16, 0.25, seed=5)
    mapping = map_program(prog, arch)
    assert _packed(mapping) > 1
    assert_engines_identical(mapping)
    (fast,) = run_array(mapping, "fast")
    assert_close(dict(fast.outputs)["C"].reshape(expected.shape), expected)


def test_reference_trace_holds_several_ops_of_a_pe_in_one_cycle():
    from dataflow.pe_array.simulate import simulate_mapping

    prog, _ = _spmm(8, 8, 8, 0.5)
    mapping = map_program(prog, variant(**SMALL, **{"pe_array.issue_width": 4}))
    res = simulate_mapping(mapping, "reference", trace=True)
    per = Counter((c, pe) for c, pe, _ in res.trace)
    assert max(per.values()) > 1
    assert sum(per.values()) == int(res.pe_busy_cycles.sum())


# --- the SpMM split's issue model --------------------------------------------------------------

def test_spmm_issue_gains_from_the_width_and_is_unchanged_at_one():
    one = load_arch(ARCH_DIR / "mlx_4x4.yaml")
    one = dataclasses.replace(one, pe_array=dataclasses.replace(one.pe_array, issue_width=1))
    four = load_arch(ARCH_DIR / "mlx_4x4.yaml")
    m = k = 4096
    n, density = 64, 0.01
    nnz = density * m * k
    for nb in (16, 32, 64):
        v = nb // 8
        # width 1: the closed form of docs/conventions.md#spmm-n-blocks-by-issue-slots
        assert spmm_issue(one, m, k, n, density)(nb) == (n // nb) * nnz / min(
            16 / (2 + 2 * v), 16 / (2 + v))
        assert spmm_issue(four, m, k, n, density)(nb) < spmm_issue(one, m, k, n, density)(nb)
    # width 4: the lsu (2 loads + v gathers a nonzero) and the read ports bind, not the slots
    assert spmm_issue(four, m, k, n, density)(64) == nnz / (16 / 10)


def test_report_draws_a_multi_issue_result(tmp_path):
    """The result file keeps the width; the Gantt chart stacks the ops of one (PE, slot) and
    the utilisation heatmap divides by the width (a result file refuses a fraction above 1)."""
    from dataflow.pe_array.simulate import simulate_mapping
    from dataflow.report import load_result, save_result, write_report

    prog, _ = _spmm(8, 8, 8, 0.5)
    res = simulate_mapping(map_program(prog, variant(**SMALL, **{"pe_array.issue_width": 4})))
    assert res.pe_busy_cycles.sum() > 0 and res.to_dict()["issue_width"] == 4
    data = load_result(save_result(res, tmp_path / "r.json"))
    assert data["result"]["issue_width"] == 4 and data["result"]["pe_utilization"] <= 1
    written, skipped = write_report(data, tmp_path / "out")
    assert skipped == [] and any(p.name == "gantt.png" for p in written)
