"""Attention sparsity patterns as UST mask tensors (docs/references.md#attention-patterns).

Each pattern is a boolean seq x seq mask (query row i may attend key column j) stored in the UST
format that describes its structure best, so the format itself says what the pattern is:

| pattern   | keys of query i                                              | UST format      |
|-----------|--------------------------------------------------------------|-----------------|
| dense     | all j                                                        | dense x dense   |
| window    | abs(i - j) <= window (sliding window, Longformer)            | DIA (diagonals) |
| dilated   | j - i = k * dilation for abs(k) <= window                    | DIA (diagonals) |
| bigbird   | blocks: global rows/cols, a band of window blocks, random    | BSR(block)      |
| butterfly | j = i and j = i xor 2^s for s < log2 seq (log2 seq strides)  | CSR             |
| nm        | n of every m consecutive keys (seeded choice per group)      | N:M structured  |

Every pattern holds the diagonal (or at least one key per row), so no softmax row is empty.
Bad parameters raise `PatternError` naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dataflow.errors import UserError
from dataflow.ust_frontend.format import TensorFormat
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.storage import build
from dataflow.ust_frontend.tensor import Tensor

PATTERNS = ("dense", "window", "dilated", "bigbird", "butterfly", "nm")

#: Pattern parameters and their defaults (the workload's CLI flags use the same names).
DEFAULTS: dict[str, object] = {
    "window": 8,  # half-width in keys (window, dilated)
    "dilation": 2,  # stride between attended keys (dilated)
    "block": 16,  # block edge in tokens (bigbird)
    "global_blocks": 1,  # leading blocks that attend and are attended by everything (bigbird)
    "window_blocks": 1,  # half-width of the block band (bigbird: 1 = BigBird's 3-block window)
    "random_blocks": 1,  # random key blocks per query block row (bigbird)
    "nm": "2:4",  # n kept out of every m keys (nm)
    "seed": 0,  # seeds the random parts (bigbird blocks, nm choices)
}

#: Which parameters each pattern reads (anything else given for it is an error).
USES: dict[str, tuple[str, ...]] = {
    "dense": (),
    "window": ("window",),
    "dilated": ("window", "dilation"),
    "bigbird": ("block", "global_blocks", "window_blocks", "random_blocks", "seed"),
    "butterfly": (),
    "nm": ("nm", "seed"),
}

#: The parameters that are integers, checked in this order; those in POSITIVE_PARAMS must be
#: >= 1 (a stride or block edge of 0 is meaningless), the rest >= 0 (counts and seeds).
INTEGER_PARAMS = ("window", "dilation", "block", "global_blocks", "window_blocks",
                  "random_blocks", "seed")
POSITIVE_PARAMS = ("dilation", "block")


class PatternError(UserError):
    """A bad attention pattern or pattern parameter (the message names the parameter)."""


@dataclass(frozen=True)
class AttentionPattern:
    """A named pattern with its resolved parameters; `pattern_mask(p)` builds its mask."""

    name: str
    seq: int
    params: tuple[tuple[str, object], ...] = field(default=())

    def __str__(self) -> str:
        ps = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.name}(seq={self.seq}{', ' + ps if ps else ''})"


def resolve(name: str, seq: int, **params) -> AttentionPattern:
    """Check `name` and its parameters (defaults filled in); raise PatternError naming the bad
    one."""
    if name not in PATTERNS:
        raise PatternError(f"unknown attention pattern {name!r}; choose one of {PATTERNS}")
    if not isinstance(seq, (int, np.integer)) or seq < 1:
        raise PatternError(f"seq must be a positive integer, got {seq!r}")
    seq = int(seq)
    _check_param_names(name, params)
    got = {k: params.get(k, DEFAULTS[k]) for k in USES[name]}
    _check_integers(got)
    _check_against_seq(name, seq, got)
    if name == "nm":
        got["nm"] = _parse_nm(got["nm"], seq)
    return AttentionPattern(name, seq, tuple(got.items()))


def _check_param_names(name: str, params) -> None:
    """Every given parameter is known, and one that pattern `name` reads."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise PatternError(f"unknown pattern parameter {unknown[0]!r}; known: {sorted(DEFAULTS)}")
    unused = sorted(set(params) - set(USES[name]))
    if unused:
        takes = ", ".join(USES[name]) or "no parameters"
        raise PatternError(f"pattern {name!r} does not take {unused[0]!r}; it takes {takes}")


def _check_integers(got: dict) -> None:
    """The integer parameters in `got` are integers (not bools) at or above their minimum;
    converted to int in place."""
    for k in INTEGER_PARAMS:
        if k in got:
            v = got[k]
            lo = 1 if k in POSITIVE_PARAMS else 0
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise PatternError(f"{k} must be an integer >= {lo}, got {v!r}")
            got[k] = int(v)


def _check_against_seq(name: str, seq: int, got: dict) -> None:
    """The bounds that depend on seq: window and dilation at most seq, BigBird's block
    dividing it (and global/random block counts at most seq / block), butterfly's seq a power
    of two."""
    if "window" in got and got["window"] > seq:
        raise PatternError(f"window must be <= seq ({seq}), got window={got['window']}")
    if "dilation" in got and got["dilation"] > seq:
        raise PatternError(f"dilation must be <= seq ({seq}), got dilation={got['dilation']}")
    if name == "bigbird":
        b = got["block"]
        if b > seq or seq % b:
            raise PatternError(f"block must divide seq ({seq}), got block={b}")
        nb = seq // b
        if got["global_blocks"] > nb:
            raise PatternError(f"global_blocks must be <= seq / block = {nb}, "
                               f"got global_blocks={got['global_blocks']}")
        if got["random_blocks"] > nb:
            raise PatternError(f"random_blocks must be <= seq / block = {nb}, "
                               f"got random_blocks={got['random_blocks']}")
    if name == "butterfly" and seq & (seq - 1):
        raise PatternError(f"the butterfly pattern needs seq a power of two, got seq={seq}")


def _parse_nm(text, seq: int) -> str:
    try:
        n, m = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise PatternError(f"nm must be written N:M (e.g. 2:4), got {text!r}") from None
    if n < 1 or m < 1:
        raise PatternError(f"nm needs N >= 1 and M >= 1, got nm={text}")
    if n > m:
        raise PatternError(f"nm needs N <= M, got N={n} > M={m} (nm={text})")
    if seq % m:
        raise PatternError(f"nm needs M to divide seq ({seq}), got M={m} (nm={text})")
    return f"{n}:{m}"


def mask_coords(p: AttentionPattern) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the pattern's entries, row-major sorted, no duplicates."""
    s, kw = p.seq, dict(p.params)
    if p.name == "dense":
        i, j = np.divmod(np.arange(s * s, dtype=np.int64), s)
    elif p.name in ("window", "dilated"):
        step = kw.get("dilation", 1)
        offsets = step * np.arange(-kw["window"], kw["window"] + 1, dtype=np.int64)
        i, j = _diagonals(s, offsets)
    elif p.name == "bigbird":
        i, j = _bigbird(s, **kw)
    elif p.name == "butterfly":
        rows = np.arange(s, dtype=np.int64)
        strides = [0] + [1 << k for k in range(s.bit_length() - 1)]  # log2 s strides + self
        i = np.repeat(rows, len(strides))
        j = (rows[:, None] ^ np.asarray(strides, dtype=np.int64)[None, :]).ravel()
    else:  # nm
        n, m = (int(x) for x in kw["nm"].split(":"))
        rng = np.random.default_rng(kw["seed"])
        groups = s // m
        # n distinct offsets per (row, group): the first n of a random permutation of 0..m-1
        keys = rng.random((s, groups, m))
        offs = np.sort(np.argsort(keys, axis=2)[:, :, :n], axis=2)
        j = (np.arange(groups, dtype=np.int64)[None, :, None] * m + offs).reshape(s, -1)
        i = np.repeat(np.arange(s, dtype=np.int64), j.shape[1])
        j = j.ravel()
    if len(i) > 1 and not ((i[1:] > i[:-1]) | ((i[1:] == i[:-1]) & (j[1:] > j[:-1]))).all():
        order = np.lexsort((j, i))  # butterfly and bigbird come out of order or repeated
        i, j = i[order], j[order]
        keep = np.ones(len(i), dtype=bool)
        keep[1:] = (i[1:] != i[:-1]) | (j[1:] != j[:-1])
        i, j = i[keep], j[keep]
    return i, j


def _diagonals(s: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.unique(offsets)
    i = np.repeat(np.arange(s, dtype=np.int64), len(offsets))
    j = i + np.tile(offsets, s)
    ok = (j >= 0) & (j < s)
    return i[ok], j[ok]


def _bigbird(s: int, *, block: int, global_blocks: int, window_blocks: int,
             random_blocks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """BigBird's block pattern (Zaheer et al., NeurIPS 2020): global + window + random blocks."""
    nb = s // block
    rng = np.random.default_rng(seed)
    blk = np.zeros((nb, nb), dtype=bool)
    blk[:global_blocks, :] = True
    blk[:, :global_blocks] = True
    for d in range(-window_blocks, window_blocks + 1):
        r = np.arange(max(0, -d), min(nb, nb - d))
        blk[r, r + d] = True
    for r in range(nb):
        blk[r, rng.choice(nb, size=random_blocks, replace=False)] = True
    bi, bj = np.nonzero(blk)
    t = np.arange(block, dtype=np.int64)
    shape = (len(bi), block, block)  # (block pair, row in block, column in block)
    i = np.broadcast_to(bi[:, None, None] * block + t[None, :, None], shape)
    j = np.broadcast_to(bj[:, None, None] * block + t[None, None, :], shape)
    return i.ravel(), j.ravel()


def pattern_format(p: AttentionPattern) -> TensorFormat:
    """The UST format the pattern's mask is stored in."""
    if p.name == "dense":
        return NamedFormats.DenseMatrixRight
    if p.name in ("window", "dilated"):
        return NamedFormats.DIAI
    if p.name == "bigbird":
        b = dict(p.params)["block"]
        return NamedFormats.BSR(b, b)
    if p.name == "nm":
        n, m = (int(x) for x in dict(p.params)["nm"].split(":"))
        return NamedFormats.NM(n, m)
    return NamedFormats.CSR


def pattern_mask(name: str | AttentionPattern, seq: int | None = None, **params) -> Tensor:
    """The pattern as a UST mask `Tensor` (value 1.0 at every attended (query, key) pair)."""
    p = name if isinstance(name, AttentionPattern) else resolve(name, seq, **params)
    fmt = pattern_format(p)
    i, j = mask_coords(p)
    st = build(fmt, (p.seq, p.seq), (i, j), np.ones(len(i), dtype=np.float32))
    return Tensor(fmt, (p.seq, p.seq), st.pos, st.crd, st.val)
