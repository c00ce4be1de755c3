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


#: the seven presets the fidelity corpus spreads over (tests/test_fidelity.py,
#: tests/test_fast_shortcuts.py): dotted-key changes to the default preset
FIDELITY_PRESETS = {
    "default": {},
    "2x2-1port": {"pe_array.rows": 2, "pe_array.cols": 2, "spm.read_ports_per_line": 1},
    "4x4-2lines": {"pe_array.rows": 4, "pe_array.cols": 4, "spm.lines": 2},
    "blocked": {"spm.address_mapping": "blocked", "spm.capacity_words_per_line": 1024},
    "lanes4-torus": {"pe_array.simd_lanes": 4, "interconnect.topology": "torus"},
    "slow-hops-narrow": {"interconnect.hop_latency_cycles": 2, "pe_array.rows": 3,
                         "pe_array.cols": 5, "interconnect.link_width_words": 2},
    "skip-hop-1dma": {"interconnect.skip_hop_strides": [2], "dram.dma_engines": 1,
                      "dram.channels": 1, "spm.lines": 4},
}
_FIDELITY_ARCHS: dict = {}


def fidelity_arch(name: str):
    """The `FIDELITY_PRESETS` arch `name`, built once per session."""
    if name not in _FIDELITY_ARCHS:
        _FIDELITY_ARCHS[name] = variant(**FIDELITY_PRESETS[name])
    return _FIDELITY_ARCHS[name]
