"""PyTorch injection: a small Transformer built in code keeps its outputs when its linear
layers (and attention projections) run through UST tensors on the numpy and sim backends."""

import copy

import numpy as np
import pytest

from dataflow.testing import assert_close
from dataflow.ust_frontend.cache import PlanCache
from dataflow.ust_frontend.torch_inject import inject, prune_2_4, prune_model, prune_n_m

torch = pytest.importorskip("torch")
nn = torch.nn

PROJECTIONS = ["enc.self_attn.in_proj[q]", "enc.self_attn.in_proj[k]", "enc.self_attn.in_proj[v]",
               "enc.self_attn.out_proj", "enc.linear1", "enc.linear2", "head"]


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                              batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.enc(x))


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TinyTransformer().eval()


@pytest.fixture
def x():
    return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def cache(tmp_path):
    return PlanCache(tmp_path)


def run(m, x):
    with torch.no_grad():
        return m(x).numpy()


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_dense_transformer_same_outputs_and_report(model, x, backend, cache):
    ref = run(model, x)
    linears = {n for n, mod in model.named_modules() if isinstance(mod, nn.Linear)}
    report = inject(model, backend=backend, cache=cache)
    assert not any(isinstance(mod, (nn.Linear, nn.MultiheadAttention)) for mod in model.modules())
    # fp32 default tolerances hold: the engine accumulates in fp32 in another order
    assert_close(run(model, x), ref, dtype=np.float32)
    assert list(report.layers) == PROJECTIONS and report.left_in_torch == []
    # every nn.Linear of the original (out_proj included) is a row
    assert linears == {"enc.self_attn.out_proj", "enc.linear1", "enc.linear2", "head"}
    assert linears <= set(report.layers)
    rows = {r["layer"]: r for r in report.rows()}
    assert rows["enc.linear1"]["shape"] == (64, 32) and rows["head"]["shape"] == (10, 32)
    assert all(r["format"] == "dense" and r["calls"] == 1 for r in rows.values())
    if backend == "sim":
        assert all(r["cycles"] > 0 and r["energy_pj"] > 0 for r in rows.values())
        assert report.total_cycles == sum(r["cycles"] for r in rows.values())
        assert "total" in report.table()
    else:
        assert report.total_cycles == 0


def test_pruned_transformer_runs_csr_through_the_engine(model, x, cache):
    sparsity = prune_model(model, 0.6)
    assert all(0.59 <= s <= 0.62 for s in sparsity.values())
    ref = run(model, x)
    report = inject(model, backend="sim", cache=cache)
    assert_close(run(model, x), ref)
    for s in report.layers.values():
        assert s.tensor_format == "CSR" and s.cycles > 0
        assert s.nnz == pytest.approx(0.4 * s.shape[0] * s.shape[1], rel=0.05)
    # a second forward reuses every plan from the cache
    builds = cache.stats.builds
    run(model, x)
    assert cache.stats.builds == builds and cache.stats.memory_hits >= len(PROJECTIONS)
    assert all(s.calls == 2 for s in report.layers.values())


def test_inject_prune_2_4(model, x, cache):
    pruned = copy.deepcopy(model)
    prune_2_4(pruned)
    ref = run(pruned, x)
    report = inject(model, backend="numpy", prune="2:4", cache=cache)
    assert_close(run(model, x), ref)
    w = model.enc.linear1.dense_weight().numpy()
    assert (np.count_nonzero(w.reshape(-1, 4), axis=1) <= 2).all()
    assert all(s.tensor_format == "CSR" and s.nnz <= s.shape[0] * s.shape[1] // 2
               for s in report.layers.values())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # the original's path
def test_encoder_stack_with_padding_mask_avoids_fused_path(x, cache):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=2).eval()
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 5:] = True
    with torch.no_grad():
        ref = enc(x, src_key_padding_mask=pad).numpy()
    report = inject(enc, backend="numpy", cache=cache)
    with torch.no_grad():
        got = enc(x, src_key_padding_mask=pad).numpy()
    # torch's nested-tensor path zeroes padded positions; compare the real tokens
    keep = ~pad.numpy()
    assert_close(got[keep], ref[keep])
    assert len(report.layers) == 2 * len(PROJECTIONS[:-1]) and report.notes
    assert all(s.calls == 1 for s in report.layers.values())


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_masks_and_weights_match_torch(batch_first, cache):
    torch.manual_seed(0)
    holder = nn.Module()
    holder.mha = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    ref_mha = copy.deepcopy(holder.mha)
    q = torch.randn(2, 5, 16) if batch_first else torch.randn(5, 2, 16)
    kv = torch.randn(2, 7, 16) if batch_first else torch.randn(7, 2, 16)
    causal = torch.ones(5, 7, dtype=torch.bool).triu(1)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 6] = True
    inject(holder, backend="numpy", cache=cache)
    for kw in ({}, {"attn_mask": causal, "key_padding_mask": pad},
               {"attn_mask": causal.float() * -1e4, "average_attn_weights": False}):
        with torch.no_grad():
            want, want_w = ref_mha(q, kv, kv, **kw)
            got, got_w = holder.mha(q, kv, kv, **kw)
        assert_close(got.numpy(), want.numpy())
        assert_close(got_w.numpy(), want_w.numpy())


def test_unsupported_attention_is_left_alone_and_reported(cache):
    holder = nn.Module()
    holder.mha = nn.MultiheadAttention(16, 4, kdim=8, vdim=8, batch_first=True).eval()
    holder.proj = nn.Linear(16, 16)
    report = inject(holder, backend="numpy", cache=cache)
    assert isinstance(holder.mha, nn.MultiheadAttention)
    assert isinstance(holder.mha.out_proj, nn.Linear)
    names = [n for n, _ in report.left_in_torch]
    assert names == ["mha", "mha.out_proj"] and list(report.layers) == ["proj"]


def test_pruning_helpers_and_errors(model):
    with pytest.raises(ValueError, match="prune amount"):
        prune_model(model, 1.5)
    with pytest.raises(ValueError, match="multiple of m"):
        prune_n_m(nn.Linear(6, 4), 2, 4)
    with pytest.raises(ValueError, match="0 < n <= m"):
        prune_n_m(model, 5, 4)
    with pytest.raises(ValueError, match="unknown backend"):
        inject(model, backend="gpu")
    with pytest.raises(ValueError, match="weight_format"):
        inject(nn.Sequential(nn.Linear(4, 4)), backend="numpy", weight_format="bsr")
    lin = nn.Sequential(nn.Linear(8, 4))
    assert prune_n_m(lin, 1, 4)["0"] == pytest.approx(0.75)


def _same_state(a: dict, b: dict):
    assert list(a) == list(b)
    for k, v in a.items():
        assert_close(v.numpy(), b[k].numpy())


def test_state_dict_keeps_the_original_keys_and_values(model, x, cache):
    prune_model(model, 0.5)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    inject(model, backend="numpy", cache=cache)
    state = model.state_dict()
    _same_state(state, original)  # same keys in the same order, same (pruned) values
    # the weights live in the buffers: the forward pass reads them (UST views, no copies)
    buffers = dict(model.named_buffers())
    assert {"head.weight_values", "head.weight_crow_indices", "head.weight_col_indices",
            "head.bias"} <= set(buffers)
    feats = torch.randn(3, 32)
    with torch.no_grad():
        before = model.head(feats) - model.head.bias
        buffers["head.weight_values"].mul_(2)
        after = model.head(feats) - model.head.bias
    assert_close(after.numpy(), 2 * before.numpy())


def test_state_dict_round_trips_between_injected_and_original_models(model, x, cache):
    import io

    prune_model(model, 0.5)
    ref = run(model, x)
    plain = copy.deepcopy(model)
    inject(model, backend="numpy", cache=cache)
    # injected -> injected (through torch.save / torch.load): same outputs
    torch.manual_seed(5)
    other = TinyTransformer().eval()
    prune_model(other, 0.3)  # another structure: loading re-derives the CSR weights
    report = inject(other, backend="numpy", cache=cache)
    assert not np.allclose(run(other, x), ref)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    other.load_state_dict(torch.load(buf))
    assert_close(run(other, x), ref)
    assert report.layers["head"].nnz == np.count_nonzero(plain.head.weight.detach().numpy())
    # injected -> original, and original -> injected
    torch.manual_seed(7)
    fresh = TinyTransformer().eval()
    fresh.load_state_dict(model.state_dict())
    assert_close(run(fresh, x), ref)
    torch.manual_seed(8)
    again = TinyTransformer().eval()
    inject(again, backend="numpy", cache=cache)
    again.load_state_dict(plain.state_dict())
    assert_close(run(again, x), ref)


def test_state_dict_load_errors_name_the_key(model, cache):
    inject(model, backend="numpy", cache=cache)
    state = model.state_dict()
    del state["head.weight"]
    with pytest.raises(RuntimeError, match='Missing key.*"head.weight"'):
        model.load_state_dict(state)
    state = model.state_dict()
    state["enc.linear1.weight"] = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match=r"size mismatch for enc.linear1.weight.*\(3, 3\)"):
        model.load_state_dict(state)
    state = model.state_dict()
    state["enc.self_attn.in_proj_weight"] = torch.zeros(96, 32)  # loads, then runs
    model.load_state_dict(state)
    assert not model.enc.self_attn.q_proj.dense_weight().any()
