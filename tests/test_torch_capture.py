"""PyTorch models captured with torch.export and simulated layer by layer."""

import numpy as np
import pytest

from dataflow.models import LayerKind, ModelError, from_torch, simulate

torch = pytest.importorskip("torch")
nn = torch.nn


class Block(nn.Module):
    """A tiny transformer block: LayerNorm, MHA (exports to SDPA), residual adds, GELU MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.ln(x)
        a, _ = self.mha(h, h, h, need_weights=False)
        x = x + a
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


class SdpaBlock(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(1, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(1, 8, 16)) * 0.5


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 8), nn.SiLU())

    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


class Sorts(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.inner = nn.Sequential(nn.Identity())

    def forward(self, x):
        return torch.sort(self.fc(x), dim=-1).values


def _x(*shape):
    torch.manual_seed(0)
    return torch.randn(*shape)


def test_tiny_transformer_block_matches_pytorch():
    torch.manual_seed(1)
    r = simulate(Block(), inputs=(_x(1, 8, 16),))
    kinds = {lr.layer.kind for lr in r.layers}
    assert {LayerKind.GEMM, LayerKind.ATTENTION, LayerKind.ELEMENTWISE} <= kinds
    assert r.values_match_reference is True
    assert r.output.shape == (1, 8, 16)
    assert all(lr.values_match_reference for lr in r.layers)
    assert r.layer("scaled_dot_product_attention").layer.size("heads") == 2


def test_sdpa_block_with_a_sparse_pattern():
    torch.manual_seed(2)
    model, x = SdpaBlock(), _x(1, 8, 16)
    dense = simulate(model, inputs=(x,))
    assert dense.values_match_reference is True
    windowed = simulate(model, inputs=(x,), attention_pattern="dilated")
    # a sparse pattern changes the values (no longer PyTorch's dense attention) and the cycles
    assert windowed.layer("scaled_dot_product_attention").values_match_reference is True
    assert windowed.cycles != dense.cycles


def test_tiny_mlp_matches_pytorch():
    torch.manual_seed(3)
    cap = from_torch(Mlp(), (_x(4, 12),))
    assert [la.kind for la in cap.model.layers] == [LayerKind.GEMM, LayerKind.ELEMENTWISE,
                                                    LayerKind.GEMM, LayerKind.ELEMENTWISE,
                                                    LayerKind.ELEMENTWISE]
    assert cap.weights["linear"]["weight"].shape == (12, 24)
    r = simulate(cap)
    assert r.values_match_reference is True
    np.testing.assert_allclose(r.output, cap.reference_output, rtol=1e-4, atol=1e-5)


def test_unsupported_op_names_op_and_module():
    with pytest.raises(ModelError) as err:
        from_torch(Sorts(), (_x(2, 8),))
    msg = str(err.value)
    assert "aten.sort" in msg and "Sorts" in msg and "module <root>" in msg
