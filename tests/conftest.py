import os
import tempfile
from pathlib import Path

import pytest

# plans made by the tests go to a throw-away folder, never to the user's ~/.cache
os.environ.setdefault("DATAFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="dataflow-test-plans-"))

ROOT = Path(__file__).resolve().parent.parent
ARCH_DIR = ROOT / "arch_configs"


@pytest.fixture(scope="session")
def default_arch():
    from dataflow.arch import load_arch

    return load_arch(ARCH_DIR / "default.yaml")


@pytest.fixture(scope="session")
def systolic_arch():
    from dataflow.arch import load_arch

    return load_arch(ARCH_DIR / "systolic_32x32.yaml")


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly without a GPU."""
    have_gpu = os.environ.get("DATAFLOW_HAVE_GPU") == "1"
    skip = pytest.mark.skip(reason="needs a CUDA GPU (set DATAFLOW_HAVE_GPU=1 on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords and not have_gpu:
            item.add_marker(skip)
