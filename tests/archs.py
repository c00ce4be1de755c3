"""Small architecture variants for engine tests (built in code from the default preset)."""

from __future__ import annotations

import copy

import yaml

from dataflow.arch import arch_from_dict
from tests.conftest import ARCH_DIR


def default_dict() -> dict:
    return yaml.safe_load((ARCH_DIR / "default.yaml").read_text())


def variant(**changes) -> object:
    """The default arch with dotted-key changes, e.g. variant(**{"spm.lines": 2})."""
    d = copy.deepcopy(default_dict())
    for key, value in changes.items():
        node = d
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return arch_from_dict(d, source="<variant "
                          + ", ".join(f"{k}={v}" for k, v in changes.items()) + ">")


def small_systolic(rows: int, cols: int):
    d = yaml.safe_load((ARCH_DIR / "systolic_32x32.yaml").read_text())
    d["pe_array"]["rows"], d["pe_array"]["cols"] = rows, cols
    return arch_from_dict(d, source=f"<systolic {rows}x{cols}>")
