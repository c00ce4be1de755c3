"""The SCALE-Sim closed form reproduces every golden SCALE-Sim 3.0.0 record.

Runs without scalesim installed: it only reads tests/data/scalesim_golden.json
(regenerate with benchmarks/scalesim/regen_golden.py).
"""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "scalesim_golden.json"


def _load_closed_form():
    path = REPO / "benchmarks" / "scalesim" / "closed_form.py"
    spec = importlib.util.spec_from_file_location("scalesim_closed_form", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cf = _load_closed_form()
DOC = json.loads(GOLDEN.read_text())
RECORDS = DOC["records"]


def test_golden_file_shape():
    assert DOC["header"]["scalesim_version"] == "3.0.0"
    assert len(RECORDS) >= 45
    assert {r["dataflow"] for r in RECORDS} == {"os", "ws", "is"}
    assert all(r["stall_cycles"] == 0 for r in RECORDS)


@pytest.mark.parametrize(
    "rec", RECORDS, ids=[f"{r['m']}x{r['n']}x{r['k']}-{r['dataflow']}" for r in RECORDS])
def test_closed_form_matches_scalesim(rec):
    got = cf.scalesim_compute_cycles(rec["m"], rec["n"], rec["k"], rec["dataflow"],
                                     rec["rows"], rec["cols"])
    assert got == rec["total_cycles"]


def test_known_values():
    # 1x1x1 on 32x32: one fold; os 1+32+32-2-1, ws/is 1+64+32-2-1
    assert cf.scalesim_compute_cycles(1, 1, 1, "os") == 62
    assert cf.scalesim_compute_cycles(1, 1, 1, "ws") == 94
    assert cf.scalesim_compute_cycles(1, 1, 1, "is") == 94
    assert cf.scalesim_mapping(2, 3, 5, "os") == (2, 3, 5)
    assert cf.scalesim_mapping(2, 3, 5, "ws") == (5, 3, 2)
    assert cf.scalesim_mapping(2, 3, 5, "is") == (5, 2, 3)
    with pytest.raises(ValueError):
        cf.scalesim_compute_cycles(1, 1, 1, "rs")
