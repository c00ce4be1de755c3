"""The plan cache: memory hits, disk hits across cache objects (as across processes), a
corrupt / truncated / stale / misplaced file ignored, deleted and rebuilt, and what the key
does and does not depend on."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow import cachefiles
from dataflow.testing import assert_close
from dataflow.ust_frontend.cache import (
    ENV_VAR,
    FORMAT_VERSION,
    PlanCache,
    code_fingerprint,
    default_cache,
    header,
    plan_file_bytes,
)
from dataflow.ust_frontend.ops import Matmul
from tests.archs import small_systolic, variant


def operands(seed=1):
    a = sp.random(12, 10, density=0.3, format="csr", dtype=np.float32, random_state=seed)
    b = np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32)
    return a, b


def key_of(a, b, **plan_kw):
    return Matmul(a, b).plan(cache=False, **plan_kw).key


def test_second_identical_call_skips_planning(tmp_path):
    cache = PlanCache(tmp_path)
    a, b = operands()
    p1 = Matmul(a, b).plan(cache=cache)
    op = Matmul(a, b)
    p2 = op.plan(cache=cache)
    assert p2 is p1 and op.plan_source == "memory"
    assert (cache.stats.builds, cache.stats.memory_hits, cache.stats.disk_writes) == (1, 1, 1)
    assert_close(op.execute("sim"), a.toarray().astype(np.float64) @ b)


def test_disk_hit_from_a_fresh_cache_object(tmp_path):
    a, b = operands()
    first = PlanCache(tmp_path)
    op1 = Matmul(a, b)
    built = op1.plan(cache=first)
    r1 = op1.execute("sim")
    second = PlanCache(tmp_path)  # a new process would start like this
    op2 = Matmul(a, b)
    loaded = op2.plan(cache=second)
    assert op2.plan_source == "disk" and second.stats.builds == 0
    assert loaded is not built and loaded.key == built.key and loaded.summary == built.summary
    np.testing.assert_array_equal(op2.execute("sim"), r1)
    assert op2.last_result.cycles == op1.last_result.cycles
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no leftovers


def _rebuilt_after(tmp_path, damage) -> PlanCache:
    a, b = operands()
    key = Matmul(a, b).plan(cache=PlanCache(tmp_path)).key
    path = PlanCache(tmp_path).path_for(key)
    damage(path)
    cache = PlanCache(tmp_path)
    op = Matmul(a, b)
    op.plan(cache=cache)
    assert op.plan_source == "built" and cache.stats.builds == 1
    assert len(cache.stats.discarded) == 1
    assert path.read_bytes().startswith(header())  # rewritten, usable again
    again = PlanCache(tmp_path)
    Matmul(a, b).plan(cache=again)
    assert again.stats.disk_hits == 1 and again.stats.builds == 0
    assert_close(op.execute("sim"), a.toarray().astype(np.float64) @ b)
    return cache


def test_garbage_file_is_deleted_and_rebuilt(tmp_path):
    cache = _rebuilt_after(tmp_path, lambda p: p.write_bytes(b"\x00garbage, not a plan\n" * 10))
    assert "bad header" in cache.stats.discarded[0]


def test_truncated_file_is_deleted_and_rebuilt(tmp_path):
    cache = _rebuilt_after(tmp_path, lambda p: p.write_bytes(p.read_bytes()[: len(header()) + 40]))
    assert "corrupt" in cache.stats.discarded[0]


def test_corrupt_pickle_after_a_good_header(tmp_path):
    cache = _rebuilt_after(tmp_path, lambda p: p.write_bytes(header() + b"\x80\x05garbage"))
    assert "corrupt" in cache.stats.discarded[0]


def test_stale_version_is_deleted_and_rebuilt(tmp_path):
    def stale(p):
        body = p.read_bytes()[len(header()):]
        p.write_bytes(f"dataflow-plan {FORMAT_VERSION + 1} {code_fingerprint()}\n".encode() + body)

    cache = _rebuilt_after(tmp_path, stale)
    assert "stale" in cache.stats.discarded[0]


def test_stale_code_fingerprint_is_deleted_and_rebuilt(tmp_path):
    def other_code(p):
        body = p.read_bytes()[len(header()):]
        p.write_bytes(f"dataflow-plan {FORMAT_VERSION} 0000000000000000\n".encode() + body)

    assert "stale" in _rebuilt_after(tmp_path, other_code).stats.discarded[0]


def test_file_holding_another_key_is_rejected(tmp_path):
    a, b = operands()
    other = Matmul(a, b[:, :3]).plan(cache=False)
    blob = plan_file_bytes(other)  # a sound file (checksum and all) under the wrong name
    cache = _rebuilt_after(tmp_path, lambda p: p.write_bytes(blob))
    assert "another key" in cache.stats.discarded[0]


def test_key_ignores_values_but_not_structure_shape_format_dtype():
    a, b = operands()
    base = key_of(a, b)
    a2 = a.copy()
    a2.data = a2.data + 5
    assert key_of(a2, b * 3) == base  # values only
    assert key_of(operands(seed=7)[0], b) != base  # another sparsity pattern
    assert key_of(a, b[:, :5]) != base  # shape
    assert key_of(a.tocsc(), b) != base  # format
    assert key_of(a, b.astype(np.float64)) != base  # dtype


def test_key_depends_on_the_op_and_every_operand_structure():
    from dataflow.ust_frontend.ops import Elementwise, Sddmm

    a, _ = operands()
    s = sp.random(12, 10, density=0.3, format="csr", dtype=np.float32, random_state=4)
    ew = {k: Elementwise(k, a, s).plan(cache=False).key for k in ("add", "multiply")}
    assert ew["add"] != ew["multiply"]
    b = sp.random(10, 6, density=0.3, format="csr", dtype=np.float32, random_state=2)
    spgemm = key_of(a, b)  # the sparse B's structure is in the key too
    assert spgemm != key_of(a, sp.random(10, 6, density=0.3, format="csr", dtype=np.float32,
                                         random_state=3))
    assert spgemm != key_of(a, b.toarray())  # SpGEMM and SpMM are other ops
    x, y = np.ones((12, 4), np.float32), np.ones((4, 6), np.float32)

    def sddmm_key(mask, scale=1.0):
        return Sddmm(x * scale, y, mask).plan(cache=False).key

    mask = sp.random(12, 6, density=0.3, format="csr", dtype=np.float32, random_state=5)
    assert sddmm_key(mask) == sddmm_key(mask * 2, scale=3.0)  # values only
    assert sddmm_key(mask) != sddmm_key(
        sp.random(12, 6, density=0.3, format="csr", dtype=np.float32, random_state=6))


def test_key_depends_on_arch_and_dataflow():
    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    assert key_of(a, b) != key_of(a, b, arch=variant(**{"spm.lines": 2}))
    sys4 = small_systolic(4, 4)
    assert key_of(a, b, arch=sys4, dataflow="os") != key_of(a, b, arch=sys4, dataflow="ws")
    assert key_of(a, b, backend="numpy") != key_of(a, b)


def test_key_is_stable_across_processes():
    a, b = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    code = ("import numpy as np; from dataflow.ust_frontend.ops import Matmul; "
            "print(Matmul(np.ones((3, 4), np.float32), np.ones((4, 2), np.float32))"
            ".plan(cache=False).key)")
    env = dict(os.environ, PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.strip()
    assert out == key_of(a, b)


def test_directory_from_argument_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert default_cache().directory == tmp_path / "env"
    assert PlanCache(tmp_path / "arg").directory == tmp_path / "arg"
    a, b = operands()
    Matmul(a, b).plan()  # cache=None: the default cache
    assert len(list((tmp_path / "env").glob("*.plan"))) == 1
    monkeypatch.delenv(ENV_VAR)
    assert PlanCache().directory == PlanCache("~/.cache/dataflow/plans").directory


def test_memory_tier_is_bounded_lru(tmp_path):
    cache = PlanCache(tmp_path, disk=False, max_memory_entries=2)
    b = np.ones((10, 2), np.float32)
    ops = [Matmul(operands(seed)[0], b) for seed in (1, 2, 3)]
    for op in ops[:2]:
        op.plan(cache=cache)
    ops[0].plan(cache=cache)  # touch: ops[1] is now the least recently used
    ops[2].plan(cache=cache)
    assert ops[0]._plan.key in cache and ops[2]._plan.key in cache
    assert ops[1]._plan.key not in cache
    ops[1].plan(cache=cache)
    assert ops[1].plan_source == "built" and cache.stats.builds == 4
    with pytest.raises(ValueError, match="max_memory_entries"):
        PlanCache(tmp_path, max_memory_entries=0)


def test_function_form_second_call_skips_planning(tmp_path):
    from dataflow.ust_frontend.ops import matmul

    cache = PlanCache(tmp_path)
    a, b = operands()
    first = matmul(a, b, backend="sim", cache=cache)
    second, res = matmul(a, b * 2, backend="sim", cache=cache, return_result=True)
    assert cache.stats.builds == 1 and cache.stats.memory_hits == 1
    assert_close(second, 2 * first)
    assert res.cycles > 0


def test_unwritable_directory_fails_loudly(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="cannot write .*DATAFLOW_CACHE_DIR"):
        Matmul(*operands()).plan(cache=PlanCache(blocker / "plans"))


def test_cache_false_always_builds(tmp_path):
    a, b = operands()
    op = Matmul(a, b)
    p1, p2 = op.plan(cache=False), op.plan(cache=False)
    assert p1 is not p2 and p1.key == p2.key and op.plan_source == "built"


def test_builder_returning_wrong_key_fails_loudly(tmp_path):
    a, b = operands()
    plan = Matmul(a, b).plan(cache=False)
    with pytest.raises(ValueError, match="asked for"):
        PlanCache(tmp_path).get_or_build("0" * 64, lambda: plan)


def test_engine_change_makes_cached_plans_and_layouts_stale(tmp_path, monkeypatch):
    """The SPM layout choice is scored by the engine: an edit to pe_array/ or spm/ must change
    the fingerprint that cached plans and layouts carry (issue 17, point 5)."""
    copy = tmp_path / "dataflow"
    shutil.copytree(cachefiles.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cachefiles, "PACKAGE_ROOT", copy)
    cachefiles.code_fingerprint.cache_clear()
    before = cachefiles.code_fingerprint()
    for edited in ("pe_array/fast.py", "spm/lines.py", "plan/spm_layout.py", "mapper/map.py"):
        with open(copy / edited, "a") as f:
            f.write("\n# an edit\n")
        cachefiles.code_fingerprint.cache_clear()
        after = cachefiles.code_fingerprint()
        assert after != before, edited
        before = after
    with open(copy / "report" / "plots.py", "a") as f:  # pictures decide no cached plan
        f.write("\n# an edit\n")
    cachefiles.code_fingerprint.cache_clear()
    assert cachefiles.code_fingerprint() == before
    cachefiles.code_fingerprint.cache_clear()
