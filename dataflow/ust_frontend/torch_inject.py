"""PyTorch injection: swap the linear layers of an unchanged `nn.Module` for UST-backed ones.

`inject(model, backend="sim")` replaces, in place:
- every `nn.Linear` by a `UstLinear` whose weight is a UST `Tensor` (CSR when pruned or
  sparse, dense otherwise) and whose forward computes y = x @ W^T + b as the SpMM/GEMM
  W @ x^T on the chosen backend (`numpy` reference or `sim`, the cycle-level engine);
- every `nn.MultiheadAttention` (packed q/k/v weights, no bias_k/bias_v, no add_zero_attn)
  by a `UstMultiheadAttention`: its q, k, v and output projections are `UstLinear`s, while
  the two activation x activation products (Q K^T and P V) and the softmax stay in torch.
  MHA is replaced whole because `F.multi_head_attention_forward` reads `out_proj.weight`
  directly, so a swapped `out_proj` alone would be bypassed. An MHA of another kind is left
  as it is, and the report lists it (with its `out_proj`) under `left_in_torch`.

Fused torch fast paths (`TransformerEncoderLayer` in eval mode, `TransformerEncoder`'s nested
tensors) read weights directly and would bypass the engine; each injected module carries a
no-op forward pre-hook, torch's documented reason to take the unfused path, and an
injected `TransformerEncoder` gets `use_nested_tensor = False`. Results are identical.

Inference only: the forward passes values through numpy, so no gradients flow. torch is
imported lazily (an optional extra, `torch==2.13.0`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.errors import UserError
from dataflow.ust_frontend.extras import require, warn_if_grad
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.ops import Matmul, get_executor
from dataflow.ust_frontend.tensor import Tensor

# Deferred imports: torch is the `torch` extra: imported in the functions that use it.

SPARSE_THRESHOLD = 0.25  # a weight with at least this fraction of zeros is stored as CSR


@dataclass
class LayerStats:
    """One engine-backed projection: static facts, then counters summed over forward passes
    (cycles at the array clock, energy in pJ). Counters stay 0 on the numpy backend."""

    name: str
    shape: tuple[int, int]  # (out_features, in_features)
    tensor_format: str  # "CSR" or "dense"
    nnz: int
    backend: str
    calls: int = 0
    cycles: int = 0
    energy_pj: float = 0.0
    macs: int = 0

    @property
    def density(self) -> float:
        return self.nnz / max(1, self.shape[0] * self.shape[1])

    def row(self) -> dict:
        return {"layer": self.name, "shape": self.shape, "format": self.tensor_format,
                "nnz": self.nnz, "density": round(self.density, 4), "backend": self.backend,
                "calls": self.calls, "cycles": self.cycles, "energy_pj": self.energy_pj,
                "macs": self.macs}


@dataclass
class InjectionReport:
    """What `inject` swapped, and the engine's counters after forward passes."""

    layers: dict[str, LayerStats] = field(default_factory=dict)
    left_in_torch: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    notes: list[str] = field(default_factory=list)

    @property
    def total_cycles(self) -> int:
        return sum(s.cycles for s in self.layers.values())

    @property
    def total_energy_pj(self) -> float:
        return sum(s.energy_pj for s in self.layers.values())

    def rows(self) -> list[dict]:
        return [s.row() for s in self.layers.values()]

    def reset(self) -> None:
        for s in self.layers.values():
            s.calls, s.cycles, s.energy_pj, s.macs = 0, 0, 0.0, 0

    def table(self) -> str:
        head = f"{'layer':32} {'shape':>10} {'format':>6} {'nnz':>7} {'calls':>5} " \
               f"{'cycles':>10} {'energy pJ':>12}"
        lines = [head]
        for s in self.layers.values():
            lines.append(f"{s.name:32} {f'{s.shape[0]}x{s.shape[1]}':>10} {s.tensor_format:>6} "
                         f"{s.nnz:>7} {s.calls:>5} {s.cycles:>10} {s.energy_pj:>12.1f}")
        lines.append(f"{'total':32} {'':>10} {'':>6} {'':>7} {'':>5} {self.total_cycles:>10} "
                     f"{self.total_energy_pj:>12.1f}")
        lines += [f"left in torch: {n} ({why})" for n, why in self.left_in_torch]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class EngineConfig:
    """Where UST-backed modules run: backend, arch (ArchSpec), dataflow, plan cache."""

    backend: str
    arch: object
    dataflow: str | None
    cache: object


def _weight_tensor(w: np.ndarray, weight_format: str | None) -> Tensor:
    w = np.ascontiguousarray(w, dtype=np.float32)
    if weight_format is None:
        zeros = 1.0 - np.count_nonzero(w) / max(1, w.size)
        weight_format = "csr" if zeros >= SPARSE_THRESHOLD else "dense"
    if weight_format == "csr":
        return Tensor.from_dense(w, NamedFormats.CSR)
    if weight_format == "dense":
        return Tensor.from_package(w)
    raise UserError(f"weight_format must be 'csr', 'dense' or None (by sparsity), "
                     f"got {weight_format!r}")


def _no_op_hook(module, args):
    return None


def _modules():
    torch = require("torch", "torch", needed_for="UST PyTorch injection")
    nn = require("torch.nn", "torch")

    return _linear_class(torch, nn), _mha_class(torch, nn)


def _linear_class(torch, nn):
    """`UstLinear`, built on the lazily imported torch (passed in by `_modules`)."""

    class UstLinear(nn.Module):
        """y = x @ W^T + b with W a UST Tensor, run as W @ x^T on the configured backend.

        W's storage arrays are the module's buffers (`weight_values`, and for CSR
        `weight_crow_indices`, `weight_col_indices`: torch views of the UST arrays, no copy),
        so `.buffers()` sees them and `weight_ust` is rebuilt from them on every call. The
        state_dict keeps nn.Linear's keys (`weight` as a dense tensor, `bias`), so checkpoints
        move between the injected and the original model both ways; loading a `weight`
        re-derives the UST weight (its format kept, its structure from the loaded zeros)."""

        def __init__(self, weight: Tensor, bias, config: EngineConfig, stats: LayerStats):
            super().__init__()
            self.out_features, self.in_features = weight.shape
            self._set_weight(weight)
            self.register_buffer("bias", None if bias is None else bias.detach().clone())
            self.config, self.stats = config, stats
            self.register_forward_pre_hook(_no_op_hook)  # keeps torch's fused paths off

        def _set_weight(self, w: Tensor) -> None:
            self._csr = not w.tensor_format.is_dense
            # not persistent: the state_dict holds the dense `weight` (see the class doc)
            self.register_buffer("weight_values", torch.from_numpy(w.val), persistent=False)
            if self._csr:
                self.register_buffer("weight_crow_indices", torch.from_numpy(w.pos(1)),
                                     persistent=False)
                self.register_buffer("weight_col_indices", torch.from_numpy(w.crd(1)),
                                     persistent=False)

        @property
        def weight_ust(self) -> Tensor:
            """The UST weight, a view of the buffers."""

            val = self.weight_values.detach().cpu().numpy()
            shape = (self.out_features, self.in_features)
            if not self._csr:
                return Tensor(NamedFormats.DenseMatrixRight, shape, [None, None], [None, None],
                              val)
            return Tensor(NamedFormats.CSR, shape,
                          [None, self.weight_crow_indices.cpu().numpy()],
                          [None, self.weight_col_indices.cpu().numpy()], val)

        def dense_weight(self):
            return torch.from_numpy(self.weight_ust.to_dense())

        def _save_to_state_dict(self, destination, prefix, keep_vars):
            destination[prefix + "weight"] = self.dense_weight()
            super()._save_to_state_dict(destination, prefix, keep_vars)

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                                  missing_keys, unexpected_keys, error_msgs):
            key = prefix + "weight"
            if key in state_dict:
                w = state_dict.pop(key)  # not a buffer name: keep it out of `unexpected`
                w = w.to_dense() if w.layout != torch.strided else w
                _reload_weight(self, w, key, error_msgs)
            elif strict:
                missing_keys.append(key)
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                          missing_keys, unexpected_keys, error_msgs)

        def forward(self, x):
            warn_if_grad("UstLinear", x)
            lead = x.shape[:-1]
            xt = np.ascontiguousarray(
                x.detach().reshape(-1, self.in_features).cpu().numpy().astype(np.float32).T)
            op = Matmul(self.weight_ust, xt)
            cfg = self.config
            if cfg.backend == "sim":
                op.plan(arch=cfg.arch, backend="sim", dataflow=cfg.dataflow, cache=cfg.cache)
            y = op.execute(cfg.backend).to_dense().T  # a Tensor, like W; tokens x out
            _count_call(self.stats, op.last_result)
            out = torch.from_numpy(np.ascontiguousarray(y)).to(x.dtype)
            if self.bias is not None:
                out = out + self.bias.to(x.dtype)
            return out.reshape(*lead, self.out_features)

        def extra_repr(self) -> str:
            return (f"in_features={self.in_features}, out_features={self.out_features}, "
                    f"format={self.stats.tensor_format}, nnz={self.stats.nnz}, "
                    f"backend={self.config.backend}")

    return UstLinear


def _mha_class(torch, nn):
    """`UstMultiheadAttention`, built on the lazily imported torch (passed in by `_modules`)."""

    class UstMultiheadAttention(nn.Module):
        """`nn.MultiheadAttention` with its four projections as `UstLinear`s; the attention
        products and softmax in torch. Same call signature and return value."""

        def __init__(self, mha, projections: dict):
            super().__init__()
            self.embed_dim, self.num_heads = mha.embed_dim, mha.num_heads
            self.head_dim = mha.embed_dim // mha.num_heads
            self.batch_first, self.dropout = mha.batch_first, mha.dropout
            self._qkv_same_embed_dim = True
            self.q_proj, self.k_proj = projections["q"], projections["k"]
            self.v_proj, self.out_proj = projections["v"], projections["out"]
            self.register_forward_pre_hook(_no_op_hook)
            # the state_dict keeps nn.MultiheadAttention's packed keys (in_proj_weight,
            # in_proj_bias, out_proj.*): checkpoints move between the two models both ways
            self.register_state_dict_post_hook(_pack_in_proj)
            self.register_load_state_dict_pre_hook(_unpack_in_proj)
            self.train(mha.training)  # a new Module starts in training mode: dropout on

        @property
        def in_proj_bias(self):
            """The packed q/k/v bias, read from the projections (as nn.MultiheadAttention's)."""
            biases = [getattr(self, p).bias for p in _QKV]
            return None if any(b is None for b in biases) else torch.cat(biases)

        def _heads(self, x):
            n, length, _ = x.shape
            return x.reshape(n, length, self.num_heads, self.head_dim).transpose(1, 2)

        def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                    attn_mask=None, average_attn_weights=True, is_causal=False):
            warn_if_grad("UstMultiheadAttention", query, key, value)
            if not self.batch_first:
                query, key, value = (t.transpose(0, 1) for t in (query, key, value))
            q = self._heads(self.q_proj(query))
            k = self._heads(self.k_proj(key))
            v = self._heads(self.v_proj(value))
            n, h, length, _ = q.shape
            s = k.shape[2]
            scores = q @ k.transpose(-2, -1) / (self.head_dim ** 0.5)
            if attn_mask is None and is_causal:
                attn_mask = torch.ones(length, s, dtype=torch.bool).triu(1)
            if attn_mask is not None and attn_mask.dim() == 3:  # (N * heads, L, S)
                attn_mask = attn_mask.reshape(n, h, length, s)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.reshape(n, 1, 1, s)
            for mask in (attn_mask, key_padding_mask):  # bool: True masks out; float: added
                if mask is None:
                    continue
                if mask.dtype == torch.bool:
                    scores = scores.masked_fill(mask, float("-inf"))
                else:
                    scores = scores + mask.to(scores.dtype)
            weights = torch.softmax(scores, dim=-1)
            if self.training and self.dropout > 0:
                weights = torch.nn.functional.dropout(weights, p=self.dropout)
            out = (weights @ v).transpose(1, 2).reshape(n, length, self.embed_dim)
            out = self.out_proj(out)
            if not self.batch_first:
                out = out.transpose(0, 1)
            if not need_weights:
                return out, None
            return out, (weights.mean(dim=1) if average_attn_weights else weights)

    return UstMultiheadAttention


def _reload_weight(layer, w, key: str, error_msgs: list) -> None:
    """Load the dense strided tensor `w` (state_dict `key`) into `layer`: its format kept, its
    structure from the loaded zeros; a shape mismatch is reported as torch reports one."""
    shape = (layer.out_features, layer.in_features)
    if tuple(w.shape) != shape:
        error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                          f"{tuple(w.shape)}, the shape in current model is {shape}")
    else:
        new = _weight_tensor(w.detach().cpu().numpy(), "csr" if layer._csr else "dense")
        layer._set_weight(new)
        layer.stats.nnz = int(np.count_nonzero(new.val))


def _count_call(stats: LayerStats, result) -> None:
    """One forward pass: a call, plus the engine's cycles, energy (pJ) and MACs if it ran."""
    stats.calls += 1
    if result is not None:
        stats.cycles += int(result.cycles)
        stats.energy_pj += float(result.energy_total_pj)
        stats.macs += int(result.macs)


_QKV = ("q_proj", "k_proj", "v_proj")


def _pack_in_proj(module, state_dict, prefix, local_metadata) -> None:
    """state_dict post-hook: q/k/v projections -> nn.MultiheadAttention's packed keys."""
    torch = require("torch", "torch")

    packed = {}  # first q/k/v key -> (packed key, value); the other two are dropped
    for part in ("weight", "bias"):
        keys = [f"{prefix}{p}.{part}" for p in _QKV]
        if all(k in state_dict for k in keys):
            packed[keys[0]] = (f"{prefix}in_proj_{part}",
                               torch.cat([state_dict[k] for k in keys]))
            packed.update({k: None for k in keys[1:]})
    if not packed:
        return
    items = list(state_dict.items())  # rebuilt in place, so the keys keep MHA's order
    state_dict.clear()
    for k, v in items:
        if k not in packed:
            state_dict[k] = v
        elif packed[k] is not None:
            state_dict[packed[k][0]] = packed[k][1]


def _unpack_in_proj(module, state_dict, prefix, local_metadata, strict, missing_keys,
                    unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook: packed in_proj_* keys -> the q/k/v projections' keys."""
    for part in ("weight", "bias"):
        key = f"{prefix}in_proj_{part}"
        if key in state_dict:
            for p, chunk in zip(_QKV, state_dict.pop(key).chunk(3)):
                state_dict[f"{prefix}{p}.{part}"] = chunk


def _mha_supported(mha) -> str | None:
    """None if `UstMultiheadAttention` reproduces `mha`, else why not."""
    if not mha._qkv_same_embed_dim:
        return "separate q/k/v projection weights (kdim/vdim) are not handled"
    if mha.bias_k is not None or mha.add_zero_attn:
        return "bias_k/bias_v or add_zero_attn are not handled"
    return None


def inject(model, backend: str = "sim", arch=None, prune=None, *, dataflow: str | None = None,
           cache=None, weight_format: str | None = None) -> InjectionReport:
    """Swap `model`'s linear layers (and whole MHA blocks, see the module doc) in place.

    `prune`: None, a fraction for magnitude pruning (`prune_model`), or "n:m" (e.g. "2:4",
    `prune_n_m`), applied to the weights first. `weight_format`: None (CSR when at least
    `SPARSE_THRESHOLD` of a weight is zero), "csr" or "dense". `arch`: ArchSpec or YAML path
    for `sim`. `cache`: a `PlanCache` (None: the default one; False: plan every call).
    Returns the report whose counters fill in as the model runs."""
    nn = require("torch.nn", "torch", needed_for="UST PyTorch injection")


    if backend not in ("numpy", "sim"):
        get_executor("matmul", backend)  # a registered backend, or an error listing them
    if isinstance(prune, str):
        n, m = (int(v) for v in prune.split(":"))
        prune_n_m(model, n, m)
    elif prune is not None:
        prune_model(model, float(prune))
    spec = None
    if backend == "sim":

        spec = resolve_arch(arch)
    config = EngineConfig(backend, spec, dataflow, cache)
    UstLinear, UstMHA = _modules()
    report = InjectionReport()

    def ust_linear(name, weight, bias):
        w = _weight_tensor(weight.detach().cpu().numpy(), weight_format)
        fmt = "dense" if w.tensor_format.is_dense else "CSR"
        stats = LayerStats(name, tuple(w.shape), fmt, int(np.count_nonzero(w.val)), backend)
        report.layers[name] = stats
        return UstLinear(w, bias, config, stats)

    def walk(module, prefix):
        for child_name, child in list(module.named_children()):
            name = f"{prefix}{child_name}"
            if isinstance(child, nn.MultiheadAttention):
                why = _mha_supported(child)
                if why:
                    report.left_in_torch.append((name, why))
                    report.left_in_torch.append((f"{name}.out_proj", "inside an MHA left in torch"))
                    continue
                e = child.embed_dim
                wq, wk, wv = child.in_proj_weight.split(e)
                bq, bk, bv = child.in_proj_bias.split(e) if child.in_proj_bias is not None \
                    else (None, None, None)
                projections = {
                    "q": ust_linear(f"{name}.in_proj[q]", wq, bq),
                    "k": ust_linear(f"{name}.in_proj[k]", wk, bk),
                    "v": ust_linear(f"{name}.in_proj[v]", wv, bv),
                    "out": ust_linear(f"{name}.out_proj", child.out_proj.weight,
                                      child.out_proj.bias),
                }
                setattr(module, child_name, UstMHA(child, projections))
            elif isinstance(child, nn.Linear):
                setattr(module, child_name, ust_linear(name, child.weight, child.bias))
            else:
                walk(child, f"{name}.")
        if (isinstance(module, nn.TransformerEncoder)
                and getattr(module, "use_nested_tensor", False)):
            module.use_nested_tensor = False
            report.notes.append(f"{prefix.rstrip('.') or '<model>'}: use_nested_tensor set to "
                                "False (the nested fast path reads weights directly)")

    walk(model, "")
    return report


def _linear_weights(model):
    """(name, weight Parameter) of every Linear and packed MHA in_proj weight."""
    nn = require("torch.nn", "torch", needed_for="UST PyTorch injection")

    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            yield name, mod.weight
        elif isinstance(mod, nn.MultiheadAttention) and mod.in_proj_weight is not None:
            yield f"{name}.in_proj_weight", mod.in_proj_weight


def prune_model(model, amount: float) -> dict[str, float]:
    """Magnitude pruning, in place: zero the `amount` fraction of smallest |w| of each linear
    weight (per layer; ties at the threshold may prune a few more). Returns name -> fraction
    of zeros after pruning."""
    torch = require("torch", "torch", needed_for="pruning")

    if not 0.0 <= amount < 1.0:
        raise UserError(f"prune amount must be in [0, 1), got {amount}")
    out = {}
    with torch.no_grad():
        for name, w in _linear_weights(model):
            k = round(amount * w.numel())
            if k:
                thresh = w.abs().flatten().kthvalue(k).values
                w.masked_fill_(w.abs() <= thresh, 0.0)
            out[name] = float((w == 0).float().mean())
    return out


def prune_n_m(model, n: int = 2, m: int = 4) -> dict[str, float]:
    """Structured N:M pruning, in place: in every group of `m` consecutive weights along the
    input dimension keep the `n` largest |w|. Every in_features must divide by m."""
    torch = require("torch", "torch", needed_for="pruning")

    if not 0 < n <= m:
        raise UserError(f"N:M pruning needs 0 < n <= m, got {n}:{m}")
    out = {}
    with torch.no_grad():
        for name, w in _linear_weights(model):
            if w.shape[-1] % m:
                raise UserError(f"{name}: in_features {w.shape[-1]} is not a multiple of m={m}")
            groups = w.reshape(-1, m)
            drop = groups.abs().argsort(dim=1)[:, : m - n]
            groups.scatter_(1, drop, 0.0)
            out[name] = float((w == 0).float().mean())
    return out


def prune_2_4(model) -> dict[str, float]:
    """2:4 structured sparsity (NVIDIA's sparse tensor core pattern); see `prune_n_m`."""
    return prune_n_m(model, 2, 4)


# -- nvmath-python's torch interface -------------------------------------------------------


class TorchUST:
    """nvmath's `torch_interface.TorchUST`, reduced to what `reformat_model` needs: a UST
    `Tensor` (`.ust`, a view of the torch buffers) made from a torch tensor. Unlike nvmath's,
    it is not a `torch.Tensor` subclass: torch ops on it are not intercepted."""

    __slots__ = ("ust",)

    def __init__(self, ust: Tensor):
        if not isinstance(ust, Tensor):
            raise UserError(f"TorchUST wraps a UST Tensor, got {type(ust).__name__}")
        self.ust = ust

    @classmethod
    def from_torch(cls, original_tensor) -> TorchUST:
        """A view of a CPU torch tensor (strided, COO, CSR, CSC, BSR or BSC) as UST."""
        return cls(Tensor.from_package(original_tensor))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ust.shape

    def __repr__(self) -> str:
        return f"TorchUST({self.ust!r})"


def reformat_model(model, func, backend: str = "numpy", arch=None, *,
                   dataflow: str | None = None, cache=None) -> InjectionReport:
    """nvmath's `reformat_model`: for every `nn.Linear` of `model`, `func(weight)` returns a
    `TorchUST` (or a UST `Tensor`) for the new weight, or None to keep the layer in torch.
    Chosen layers become `UstLinear`s running on `backend` (default the numpy reference;
    "sim" runs the engine on `arch`); a weight in a format other than dense or CSR is
    converted to CSR (the formats `UstLinear` runs). Returns the `InjectionReport`."""
    from torch import nn  # the torch extra: imported where a model is met

    if not callable(func):
        raise UserError(f"reformat_model: func must be callable, got {type(func).__name__}")
    if backend not in ("numpy", "sim"):
        get_executor("matmul", backend)
    spec = resolve_arch(arch) if backend == "sim" else None
    config = EngineConfig(backend, spec, dataflow, cache)
    UstLinear, _ = _modules()
    report = InjectionReport()

    def walk(module, prefix):
        for child_name, child in list(module.named_children()):
            name = f"{prefix}{child_name}"
            if not isinstance(child, nn.Linear):
                walk(child, f"{name}.")
                continue
            chosen = func(child.weight.detach())
            if chosen is None:
                report.left_in_torch.append((name, "func returned None"))
                continue
            w = chosen.ust if isinstance(chosen, TorchUST) else chosen
            if not isinstance(w, Tensor):
                raise UserError(f"reformat_model: func returned {type(w).__name__} for "
                                f"{name}; return a TorchUST, a UST Tensor or None")
            if tuple(w.shape) != tuple(child.weight.shape):
                raise UserError(f"reformat_model: {name}'s weight has shape "
                                f"{tuple(child.weight.shape)}, func returned {w.shape}")
            if not w.tensor_format.is_dense and w.tensor_format != NamedFormats.CSR:
                w = w.convert(tensor_format=NamedFormats.CSR)
            fmt = "dense" if w.tensor_format.is_dense else "CSR"
            stats = LayerStats(name, tuple(w.shape), fmt, int(np.count_nonzero(w.val)),
                               backend)
            report.layers[name] = stats
            setattr(module, child_name, UstLinear(w, child.bias, config, stats))

    walk(model, "")
    return report
