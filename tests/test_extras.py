"""A missing optional package is one UserError naming the extra and the pip command."""

import sys

import numpy as np
import pytest
import torch

import dataflow
from dataflow.cuda.compare import compare
from dataflow.cuda.ops import _kernels
from dataflow.dse import pareto
from dataflow.errors import UserError
from dataflow.ust_frontend import interop
from dataflow.ust_frontend.extras import MissingExtraError, require, warn_if_grad
from dataflow.ust_frontend.ops import matmul

# the kernel modules, imported now in the mode this process can run (the simulator without a
# GPU), before any test blocks numba.cuda: importing them directly here would pick GPU mode
_kernels()

NUMBA_CUDA = ("numba.cuda", "numba.cuda.core", "numba.cuda.core.config")


def _block(monkeypatch, *names):
    for n in names:
        monkeypatch.setitem(sys.modules, n, None)  # `import n` now fails


def test_require_names_the_extra(monkeypatch):
    _block(monkeypatch, "optuna")
    with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[dse\]"') as e:
        require("optuna", "dse", needed_for="--search optuna")
    assert isinstance(e.value, UserError) and "--search optuna" in str(e.value)


def test_cuda_backend_without_numba_cuda(monkeypatch):
    _block(monkeypatch, *NUMBA_CUDA)
    a = np.ones((2, 2), np.float32)
    with pytest.raises(MissingExtraError, match=r"'cuda' extra.*\.\[cuda\]"):
        dataflow.matmul(a, a, backend="cuda")


def test_compare_models_a_gpu_without_numba_cuda(monkeypatch):
    _block(monkeypatch, *NUMBA_CUDA)
    r = compare("gemm", gpus=["jetson_xavier_nx"], measure_if_present=False)
    assert r.gpus[0].time_source == "modelled" and r.gpus[0].seconds > 0


def test_parquet_without_pyarrow(monkeypatch, tmp_path):
    _block(monkeypatch, "pyarrow", "pyarrow.parquet")
    with pytest.raises(MissingExtraError, match=r"\.\[dse\]"):
        pareto.write_parquet([{"x": 1}], tmp_path / "x.parquet")


def test_torch_view_without_torch(monkeypatch):
    _block(monkeypatch, "torch")
    with pytest.raises(MissingExtraError, match=r"\.\[torch\]"):
        interop.torch_object("torch.strided", (), None, (1,), None)


def test_grad_warning():
    torch = pytest.importorskip("torch")
    x = torch.ones(2, 2, requires_grad=True)
    with pytest.warns(UserWarning, match="gradients do not flow"):
        warn_if_grad("matmul", x)


def test_frontend_ops_warn_when_gradients_cannot_flow():
    a = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(3, 2)
    with pytest.warns(UserWarning, match="no grad_fn"):
        matmul(a, b)
    q = torch.randn(8, 4, requires_grad=True)
    with pytest.warns(UserWarning, match="sparse_attention"):
        dataflow.sparse_attention(q, q.detach(), q.detach(), pattern="window", window=1)
