"""Top-k gating, dispatch order and the numpy reference of a mixture-of-experts layer.

Y[t] = sum over the top_k experts e of token t of gate[t, e] * (X[t] @ W[e]), with the gates
the softmax of the selected logits (renormalised over the top k, as Mixtral; k = 1 gives
Switch-Transformer routing, docs/references.md#pit lists Switch-Transformer MoE among PIT's
dynamic-sparsity workloads: which tokens reach which expert is known only at run time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dataflow.errors import UserError
from dataflow.workloads import check_host_memory, dense_bytes


def check_moe_params(experts: int, top_k: int, tokens: int, dim: int, hidden: int) -> None:
    for name, v in (("experts", experts), ("top-k", top_k), ("tokens", tokens), ("dim", dim),
                    ("hidden", hidden)):
        if v <= 0:
            raise UserError(f"--{name} must be a positive integer, got {v}")
    if top_k > experts:
        raise UserError(f"--top-k ({top_k}) cannot exceed --experts ({experts})")


@dataclass(frozen=True, eq=False)
class Routing:
    """Which experts each token goes to, with what weight, and the dispatch order.

    `expert[t, s]`, `gate[t, s]`: the s-th choice of token t (descending logit; ties to the
    lower expert index). Dispatched rows are grouped by expert, tokens ascending within each:
    row r holds token `token_of_row[r]`; expert e owns rows [offsets[e], offsets[e + 1]).
    `row_of[t, s]` is the row holding token t's s-th choice."""

    expert: np.ndarray
    gate: np.ndarray
    token_of_row: np.ndarray
    offsets: np.ndarray
    row_of: np.ndarray

    @property
    def tokens_per_expert(self) -> np.ndarray:
        return np.diff(self.offsets)


def route(logits: np.ndarray, top_k: int) -> Routing:
    """Top-k routing of `logits` (tokens x experts), computed in float64."""
    t, e = logits.shape
    if not 0 < top_k <= e:
        raise UserError(f"--top-k ({top_k}) must be between 1 and --experts ({e})")
    lg = np.asarray(logits, dtype=np.float64)
    order = np.argsort(-lg, axis=1, kind="stable")[:, :top_k]
    sel = np.take_along_axis(lg, order, axis=1)
    w = np.exp(sel - sel.max(axis=1, keepdims=True))
    gate = w / w.sum(axis=1, keepdims=True)
    flat_e = order.ravel()
    flat_t = np.repeat(np.arange(t), top_k)
    by_expert = np.lexsort((flat_t, flat_e))  # expert, then token
    row_of = np.empty(t * top_k, dtype=np.int64)
    row_of[by_expert] = np.arange(t * top_k)
    offsets = np.concatenate(([0], np.cumsum(np.bincount(flat_e, minlength=e)))).astype(np.int64)
    return Routing(expert=order.astype(np.int64), gate=gate, token_of_row=flat_t[by_expert],
                   offsets=offsets, row_of=row_of.reshape(t, top_k))


def make_moe_operands(experts: int, tokens: int, dim: int, hidden: int, skew: float = 0.0,
                      seed: int = 0):
    """X (tokens x dim), the gate's weights Wg (dim x experts), its bias (-skew * e: skew > 0
    sends more tokens to the low-numbered experts) and the experts' W (experts x dim x hidden);
    fp32, seeded, scaled so logits and outputs are about unit size."""
    if not math.isfinite(skew):
        raise UserError(f"--skew must be a finite number, got {skew}")
    if skew < 0:
        raise UserError(f"--skew must be >= 0, got {skew}")
    # X, Wg, W, the dispatched rows (top_k <= experts of them per token) and Y, twice over:
    # the program's copies and the float64 reference
    check_host_memory(f"moe operands (--experts {experts} --tokens {tokens} --dim {dim} "
                      f"--hidden {hidden})",
                      2 * dense_bytes((tokens, dim), (dim, experts), (experts, dim, hidden),
                                      (tokens, experts, dim + hidden), (tokens, hidden)))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, dim), dtype=np.float32)
    wg = (rng.standard_normal((dim, experts)) / np.sqrt(dim)).astype(np.float32)
    bias = (-skew * np.arange(experts)).astype(np.float32)
    w = (rng.standard_normal((experts, dim, hidden)) / np.sqrt(dim)).astype(np.float32)
    return x, wg, bias, w


def gate_logits(x, wg, bias) -> np.ndarray:
    return x.astype(np.float64) @ wg.astype(np.float64) + bias


def moe_reference(x, wg, bias, w, top_k: int) -> np.ndarray:
    """The definition: gating, every expert on its tokens, gate-weighted combine; float64
    arithmetic, returned as float32."""
    r = route(gate_logits(x, wg, bias), top_k)
    y = np.zeros((x.shape[0], w.shape[2]))
    for s in range(top_k):
        for e in range(w.shape[0]):
            tok = np.flatnonzero(r.expert[:, s] == e)
            y[tok] += r.gate[tok, s, None] * (x[tok].astype(np.float64) @ w[e].astype(np.float64))
    return y.astype(np.float32)
