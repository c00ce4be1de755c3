"""Damaged cache files are never trusted: one flipped byte anywhere in a real plan file (its
header line, the middle of the pickle, its last bytes) makes the cache discard the file and
rebuild the plan, which then gives the clean run's cycles and values and rewrites the file; a
layout file that is damaged, or well-formed JSON with content no butterfly can use, is deleted
instead of reaching the lowering (issue 15, section 4)."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.cachefiles import CacheEntryError, EntryFault, frame_entry, unframe_entry
from dataflow.plan import spm_layout
from dataflow.ust_frontend.cache import FORMAT_VERSION, PlanCache
from dataflow.ust_frontend.ops import Matmul

TRIALS_PER_REGION = 50  # header, middle, end: 150 flips in all


def _operands():
    a = sp.random(40, 32, density=0.2, format="csr", dtype=np.float32, random_state=1)
    b = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    return a, b


def _flip_positions(size: int, header_len: int, rng) -> dict[str, np.ndarray]:
    middle = (size + header_len) // 2
    return {"header": rng.integers(0, header_len + 1, TRIALS_PER_REGION),  # incl. its newline
            "middle": rng.integers(middle - 200, middle + 200, TRIALS_PER_REGION),
            "end": rng.integers(size - 64, size, TRIALS_PER_REGION)}


def test_every_flipped_byte_of_a_plan_file_is_discarded_and_rebuilt(tmp_path):
    a, b = _operands()
    clean_op = Matmul(a, b)
    plan = clean_op.plan(cache=PlanCache(tmp_path))
    want_values = clean_op.execute("sim")
    want_cycles = clean_op.last_result.cycles
    path = PlanCache(tmp_path).path_for(plan.key)
    clean = path.read_bytes()  # a real plan file, some 10 kB
    header_len = clean.index(b"\n")
    rng = np.random.default_rng(15)
    outcomes = {}
    for region, positions in _flip_positions(len(clean), header_len, rng).items():
        for pos in positions:
            damaged = bytearray(clean)
            damaged[pos] ^= int(rng.integers(1, 256))
            path.write_bytes(bytes(damaged))
            cache = PlanCache(tmp_path)
            op = Matmul(a, b)
            op.plan(cache=cache)
            where = f"{region} byte {pos}"
            assert op.plan_source == "built", f"{where}: a damaged file was trusted"
            assert len(cache.stats.discarded) == 1, where
            assert cache.stats.discarded[0].split(": ", 1)[1].startswith(
                ("corrupt", "stale", "not a cache file")), cache.stats.discarded
            got = op.execute("sim")
            assert op.last_result.cycles == want_cycles, where
            np.testing.assert_array_equal(got, want_values, err_msg=where)
            # rewritten: a sound file again, which the next process loads and runs alike
            unframe_entry("plan", FORMAT_VERSION, path.read_bytes())
            reloaded, later = PlanCache(tmp_path), Matmul(a, b)
            later.plan(cache=reloaded)
            assert later.plan_source == "disk", f"{where}: not rewritten"
            np.testing.assert_array_equal(later.execute("sim"), want_values, err_msg=where)
            assert later.last_result.cycles == want_cycles, where
            reason = cache.stats.discarded[0].split(": ", 1)[1].split(" ")[0]
            outcomes[reason] = outcomes.get(reason, 0) + 1
    assert sum(outcomes.values()) == 3 * TRIALS_PER_REGION
    # the flips reached the checksum, not only the header check
    assert outcomes.get("corrupt", 0) >= 2 * TRIALS_PER_REGION, outcomes


def test_frame_round_trips_and_names_each_fault():
    blob = frame_entry("thing", 3, b"payload\nwith lines")
    assert unframe_entry("thing", 3, blob) == b"payload\nwith lines"
    cases = {EntryFault.STALE: frame_entry("thing", 4, b"payload"),
             EntryFault.BAD_HEADER: b"\x00" + blob,
             EntryFault.CORRUPT: blob[:-1] + b"?"}
    for fault, bad in cases.items():
        with pytest.raises(CacheEntryError) as err:
            unframe_entry("thing", 3, bad)
        assert err.value.fault is fault
    with pytest.raises(CacheEntryError, match="stale"):
        unframe_entry("other", 3, blob)  # another kind's file: its format says so


STAGES, BUFFERS = 3, 2
KEY = ("a layout key",)
GOOD = (((0, 1, 2), (2, 0, 1)), (0, 5)), "a note"


@pytest.fixture
def layout_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    return tmp_path / "layouts"


def test_layout_file_round_trips(layout_dir):
    spm_layout._layout_disk_put(KEY, GOOD)
    assert spm_layout._layout_disk_get(KEY, STAGES, BUFFERS) == GOOD
    spm_layout._layout_disk_put(KEY, (((), ()), "identity"))
    assert spm_layout._layout_disk_get(KEY, STAGES, BUFFERS) == (((), ()), "identity")


@pytest.mark.parametrize("content", [
    {"perms": [[0, 0, 1], [2, 0, 1]], "masks": [0, 5]},  # not a permutation
    {"perms": [[0, 1, 2]], "masks": [0]},  # one buffer short
    {"perms": [[0, 1, 2], [2, 0, 1]], "masks": [0, 8]},  # a mask past 2**stages
    {"perms": [[0, 1, 2], [2, 0, 1]], "masks": [0, True]},  # not an int
    {"perms": "012", "masks": [0, 5]},
    {"perms": [[0, 1, 2], [2, 0, 1]]},  # a missing key
    {"perms": [[0, 1, 2], [2, 0, 1]], "masks": [0, 5], "key": "another key"},
])
def test_valid_json_with_invalid_content_is_deleted(layout_dir, content):
    record = {"key": repr(KEY), "note": "n", **content}
    path = spm_layout._layout_file(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(frame_entry(spm_layout.LAYOUT_KIND, spm_layout.LAYOUT_FORMAT_VERSION,
                                 json.dumps(record).encode()))
    assert spm_layout._layout_disk_get(KEY, STAGES, BUFFERS) is None
    assert not path.exists()


def test_flipped_bytes_of_a_layout_file_are_deleted(layout_dir):
    spm_layout._layout_disk_put(KEY, GOOD)
    path = spm_layout._layout_file(KEY)
    clean = path.read_bytes()  # a real plan file, some 10 kB
    for pos in range(len(clean)):
        damaged = bytearray(clean)
        damaged[pos] ^= 0x01
        path.write_bytes(bytes(damaged))
        assert spm_layout._layout_disk_get(KEY, STAGES, BUFFERS) is None, pos
        assert not path.exists(), pos
