"""Lowering of butterfly products (and the FFT) to `Program`s: one kernel per *stage group*.

Data layout: a batch of `batch` vectors of length n is held as [nb, n, L] (nb = batch / L
batch blocks, L = SIMD lanes), so one SIMD vector is one point of L sequences and one SPM row.
A kernel for the group of stages k0 .. k0+f-1 (stride s = 2^k0) runs

    for bo in [0, nb):  for g in [0, n / (s 2^f)):  for o in [0, s):  for bi in lanes (vector)

(g and o as one extent-2 loop per index bit, so any address that is a weighted sum of index bits
is affine: bit reversal and the skewed layout below)

and each iteration loads the 2^f points P(m) = g s 2^f + o + m s (m < 2^f) of one radix-2^f
sub-butterfly, applies the f stages in registers (values pass between PEs over links, never
through the SPM), and stores the 2^f results. f = 1 is a plain per-stage kernel; f > 1 is a
*fused* kernel. The stride-2^k exchange is the address pattern P(m); inside a fused kernel it
becomes the routes between the PEs holding the pairs (over skip-hop links when the arch has
them, see `dataflow.plan.orchestrate`).

Decimation-in-time needs the bit-reversed input: the first group addresses its loads through
the bit loops, so bitrev(P) is affine (bit-reversed addressing, no separate permutation pass).

SPM layout of the data between groups: natural [nb, n, L] (one point of L sequences per SPM row),
or, for buffers that never cross DRAM (multilayer), *skewed*: row(P) = sum_d P >> (d z) with
2^z lines (complex: re and im rows interleaved, z for half the lines), so the points of one
sub-butterfly, a power of two apart, sit on different SPM lines instead of all on one.

Stage coefficients (docs/references.md#butterfly-sparsity: 2n parameters per factor):
  * `fft`: t = w x_hi, [x_lo + t, x_lo - t]; stage k's table T{k} holds (Re w, Im w) for the
    2^k distinct twiddles (Re t = wr xr - wi xi as MUL then a negating MAC, Im t = wr xi + wi xr
    as MUL then MAC); constant twiddles become CONST nodes, w = 1 is skipped and w = -i
    (t = (xi, -xr)) goes straight to the butterfly unit, no multiply (the radix-4 trick).
  * `real`: per pair [[a, b], [c, d]] from F{k} (4 words per pair).
  * `complex`: per pair, each of a, b, c, d as (re, im) from F{k} (8 words per pair).
The upper/lower sums use Op.BFLY (a + s*b on the butterfly unit, FABNet's butterfly engine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow.dfg.butterfly_spec import (
    KINDS,
    ButterflyKind,
    ButterflySpec,
    data_names,
    data_parts,
    data_rows,
    is_skewed,
    skew_mask,
    skew_period,
    skew_permutation,
    skew_row,
    skew_rows,
    skew_weight,
    split_stages,
)
from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program, StageGroup
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op


class _Body:
    """Builds a kernel body: one node per distinct (op, inputs, buffer, address, value)."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.memo: dict = {}

    def add(self, op: Op, inputs=(), buffer=None, addr=None, value=0.0, name="") -> int:
        key = (op, tuple(inputs), buffer, addr, value)
        if op is not Op.STORE and key in self.memo:
            return self.memo[key]
        nid = len(self.nodes)
        self.nodes.append(Node(nid, op, tuple(inputs), buffer, addr, float(value), name))
        self.memo[key] = nid
        return nid


def _addr(terms: dict[str, int], const: int = 0) -> Addr:
    return Addr(tuple(sorted((v, c) for v, c in terms.items() if c)), int(const))


def twiddle_bit(bit: int, k: int, k0: int) -> int:
    """Position of bit `bit` of stage k's twiddle index in its table, for the kernel whose
    group starts at stage k0: the bits k0 .. k-1 (set by the sub-butterfly's own points, one
    twiddle each) go to the bottom and the loop bits 0 .. k0-1 above them, so the 2^(k-k0)
    twiddles one iteration loads sit side by side (one or two SPM rows), not 2^k0 entries apart
    on one SPM line (a read-port conflict every iteration)."""
    return bit - k0 if bit >= k0 else bit + k - k0


def twiddle_position(index, k: int, k0: int):
    """Table slot of twiddle `index` of stage k (bits placed by `twiddle_bit`)."""
    index = np.asarray(index)
    if not k:
        return index * 0
    return sum(((index >> bit) & 1) << twiddle_bit(bit, k, k0) for bit in range(k))


@dataclass(frozen=True)
class _GroupShape:
    """What the loops and addresses of one stage group's kernel depend on (names as in the
    module docstring: stride s = 2^k0, f stages, index bits of g and o as extent-2 loops)."""

    spec: ButterflySpec
    groups: int
    index: int  # of this group among `groups`
    k0: int  # first stage
    f: int  # stages in the group
    bitrev: bool  # this group reads the input in bit-reversed order

    @property
    def stages(self) -> int:
        return self.spec.stages

    @property
    def stride(self) -> int:
        return 1 << self.k0

    @property
    def g_bits(self) -> int:
        return self.stages - self.k0 - self.f

    def loops(self) -> list[Loop]:
        """One extent-2 loop per bit of g and of o (most significant first, so iterations run
        in the order of (g, o)): every address below is then a weighted sum of index bits,
        which makes bit reversal and the skewed SPM layout affine."""
        spec = self.spec
        loops = [Loop("bo", spec.outer)]
        if spec.col_bits:
            loops.append(Loop("kh", spec.col_blocks))
        loops += [Loop(f"g{t}", 2) for t in reversed(range(self.g_bits))]
        loops += [Loop(f"o{t}", 2) for t in reversed(range(self.k0))]
        loops.append(Loop("bi", spec.lanes))
        return loops

    def lin(self, weight, m: int, scale: int = 1, extra: dict | None = None,
            flip=lambda bit: 0) -> Addr:
        """scale * sum of weight(b) over the set bits b of P(m) = g s 2^f + o + m s, with the
        bits where flip(b) is 1 inverted (weight w - w bit: a negative coefficient)."""
        S, k0, f, s, gb = self.stages, self.k0, self.f, self.stride, self.g_bits
        sign = {bit: -1 if flip(bit) else 1 for bit in range(S)}
        terms = {f"g{t}": sign[k0 + f + t] * scale * weight(k0 + f + t) for t in range(gb)}
        terms.update({f"o{t}": sign[t] * scale * weight(t) for t in range(k0)})
        const = scale * sum(weight(bit) for bit in range(S)
                            if ((m * s >> bit) & 1) ^ (1 if flip(bit) else 0))
        for k, c in (extra or {}).items():
            terms[k] = terms.get(k, 0) + c
        return _addr(terms, const)

    def point_addr(self, m: int, i: int, part: int = 0) -> Addr:
        """Word address of part (0 re, 1 im) of point P(m) in data buffer i: [nb, rows, L] with
        row = P (natural) or skew_row(P); complex skewed buffers hold [nb, rows, 2, L]. The
        bit-reversed input is read at row(bitrev(P))."""
        spec, groups, S, L = self.spec, self.groups, self.stages, self.spec.lanes
        sk = is_skewed(spec, i, groups)
        perm = skew_permutation(spec, i, groups)
        row_w = ((lambda q: skew_weight(perm[q], skew_period(spec))) if sk
                 else (lambda q: 1 << q))
        mask = skew_mask(spec, i) if sk else 0

        def fl(q):
            return (mask >> q) & 1

        if i == 0 and self.bitrev:
            w, flip = (lambda bit: row_w(S - 1 - bit)), (lambda bit: fl(S - 1 - bit))
        else:
            w, flip = row_w, fl
        parts = data_parts(spec, i, groups)
        block = data_rows(spec, sk) * L * parts
        outer = ({"bo": block * spec.col_blocks, "kh": block} if spec.col_bits
                 else {"bo": block})
        a = self.lin(w, m, L * parts, {**outer, "bi": 1}, flip)
        return Addr(a.terms, a.const + part * L * (parts - 1))


def group_kernel(spec: ButterflySpec, group: StageGroup, groups: int, index: int) -> Kernel:
    """The kernel of stage group `index` (of `groups`) of `spec`."""
    spec.verify()
    n, f, k0 = spec.n, group.count, group.first
    S = spec.stages
    if n // ((1 << k0) << f) < 1:
        raise DFGError(f"stage group {group} runs past stage {S - 1} of a size-{n} butterfly")
    bitrev = spec.bitrev_input and index == 0
    if bitrev and k0:
        raise DFGError("bit-reversed input addressing needs the group that starts at stage 0")
    shape = _GroupShape(spec, groups, index, k0, f, bitrev)
    b = _Body()
    x = _load_points(b, shape)
    coef_bufs = _apply_stages(b, shape, x)
    _store_points(b, shape, x)
    bufs = _group_buffers(shape, coef_bufs)
    used = {nd.buffer for nd in b.nodes if nd.buffer}
    name = f"{spec.prefix}bfly_s{k0}" + (f"-{group.last}" if f > 1 else "")
    return Kernel(name=name, loops=tuple(shape.loops()), nodes=tuple(b.nodes),
                  buffers=tuple(bf for bf in bufs if bf.name in used), vector_var="bi")


def _load_points(b: _Body, shape: _GroupShape) -> list:
    """Load the 2^f points of one sub-butterfly: (re, im) node ids, im None for real data."""
    spec, index = shape.spec, shape.index
    in_r, in_i = data_names(spec, index, shape.groups)
    x = []
    for m in range(1 << shape.f):
        a = shape.point_addr(m, index)
        re = b.add(Op.LOAD, buffer=in_r, addr=a, name=f"x{m}.re")
        if not spec.complex_data:
            x.append((re, None))
        elif spec.real_input and index == 0:
            # no imaginary part: matrix butterflies skip its terms; twiddles multiply a zero
            x.append((re, None if spec.kind == ButterflyKind.COMPLEX
                      else b.add(Op.CONST, value=0.0, name="0")))
        else:
            x.append((re, b.add(Op.LOAD, buffer=in_i, addr=shape.point_addr(m, index, 1),
                                name=f"x{m}.im")))
    return x


def _apply_stages(b: _Body, shape: _GroupShape, x: list) -> dict[str, int]:
    """Apply the group's f stages to the points `x` in place; returns the coefficient
    buffers read, name -> words."""
    spec, k0, f = shape.spec, shape.k0, shape.f
    cb, L, lin = spec.col_bits, spec.lanes, shape.lin
    coef_bufs: dict[str, int] = {}
    for j in range(f):
        k = k0 + j
        half = 1 << j
        for m in range(1 << f):
            if m & half:
                continue
            lo, hi = x[m], x[m + half]
            if spec.kind == ButterflyKind.FFT and cb:
                # column pass: stage cb + k of the big FFT, twiddle index (P_lo mod 2^k) 2^cb + k1
                # with k1 = kh L + bi; table layout `twiddle_position`
                buf = f"{spec.prefix}C{cb + k}"
                blk = spec.col_block_words
                tw = lin(lambda bit, k=k, blk=blk: 2 * blk << twiddle_bit(bit, k, k0)
                         if bit < k else 0, m, 1, {"kh": L, "bi": 1})
                x[m], x[m + half] = _fft_pair(b, lo, hi, k, buf, tw, blk, (m << k0) % (1 << k))
                coef_bufs[buf] = 2 * blk << k
            elif spec.kind == ButterflyKind.FFT:
                # twiddle index: P_lo mod 2^k, 2 words (re, im) each; table layout
                # `twiddle_position`
                buf = f"{spec.prefix}T{k}"
                tw = lin(lambda bit, k=k: 1 << twiddle_bit(bit, k, k0) if bit < k else 0, m, 2)
                x[m], x[m + half] = _fft_pair(b, lo, hi, k, buf, tw, 1, (m << k0) % (1 << k))
                coef_bufs[buf] = 2 * (1 << k)
            else:
                # pair number: P_lo with its bit k removed
                words = 4 if spec.kind == ButterflyKind.REAL else 8
                base = lin(lambda bit, k=k: (1 << (bit - 1)) if bit > k
                           else ((1 << bit) if bit < k else 0), m, words)
                buf = f"{spec.prefix}F{k}"
                coef_bufs[buf] = words * (spec.n // 2)
                x[m], x[m + half] = _matrix_pair(b, spec, lo, hi, base, buf)
    return coef_bufs


def _store_points(b: _Body, shape: _GroupShape, x: list) -> None:
    """The last group's epilogue (bias, ReLU), then the stores of the 2^f results."""
    spec, index = shape.spec, shape.index
    out_r, out_i = data_names(spec, index + 1, shape.groups)
    last = index == shape.groups - 1
    for m in range(1 << shape.f):
        a = shape.point_addr(m, index + 1)
        re, im = x[m]
        if last and spec.bias:
            bias = b.add(Op.LOAD, buffer=f"{spec.prefix}bias",
                         addr=shape.lin(lambda bit: 1 << bit, m), name=f"b{m}")
            re = b.add(Op.ADD, (re, bias), name=f"y{m}+b")
        if last and spec.relu:
            re = b.add(Op.MAX, (re, b.add(Op.CONST, value=0.0, name="0")), name=f"relu{m}")
        b.add(Op.STORE, (re,), buffer=out_r, addr=a, name=f"y{m}.re")
        if spec.complex_data and not (last and spec.real_output):
            b.add(Op.STORE, (im,), buffer=out_i, addr=shape.point_addr(m, index + 1, 1),
                  name=f"y{m}.im")


def _group_buffers(shape: _GroupShape, coef_bufs: dict[str, int]) -> list[Buffer]:
    """Input data, coefficient tables, bias, output data (in that order)."""
    spec, index, groups = shape.spec, shape.index, shape.groups
    cplx, L, n = spec.complex_data, spec.lanes, spec.n
    in_r, in_i = data_names(spec, index, groups)
    out_r, out_i = data_names(spec, index + 1, groups)
    last = index == groups - 1
    win = (spec.blocks * data_rows(spec, is_skewed(spec, index, groups)) * L
           * data_parts(spec, index, groups))
    wout = (spec.blocks * data_rows(spec, is_skewed(spec, index + 1, groups)) * L
            * data_parts(spec, index + 1, groups))
    bufs = [Buffer(in_r, win)]
    if cplx and not (spec.real_input and index == 0) and in_i != in_r:
        bufs.append(Buffer(in_i, win))
    bufs += [Buffer(name, size) for name, size in coef_bufs.items()]
    if last and spec.bias:
        bufs.append(Buffer(f"{spec.prefix}bias", n))
    bufs.append(Buffer(out_r, wout, "output"))
    if cplx and not (last and spec.real_output) and out_i != out_r:
        bufs.append(Buffer(out_i, wout, "output"))
    return bufs


def _snap(v: float) -> float:
    r = round(v)
    return float(r) if abs(v - r) < 1e-12 else float(v)


def _fft_pair(b: _Body, lo, hi, k, buf, tw: Addr, part_stride: int, index: int):
    """DIT butterfly: t = w * hi; (lo + t, lo - t). w = T{k}[tw] (re at tw, im at tw +
    part_stride), or, when the twiddle index does not depend on the loops, the constant
    w = W_(2^(k+1))^index: w = 1 needs no multiply, nor does w = -i (t = (hi.im, -hi.re): the
    butterfly unit adds and subtracts the swapped parts)."""
    if not tw.terms:
        w = np.exp(-2j * np.pi * index / (2 << k))
        wr, wi = _snap(w.real), _snap(w.imag)
        if (wr, wi) == (0.0, -1.0):
            up = (b.add(Op.BFLY, (lo[0], hi[1]), value=1.0, name="+"),
                  b.add(Op.BFLY, (lo[1], hi[0]), value=-1.0, name="-"))
            dn = (b.add(Op.BFLY, (lo[0], hi[1]), value=-1.0, name="-"),
                  b.add(Op.BFLY, (lo[1], hi[0]), value=1.0, name="+"))
            return up, dn
        if (wr, wi) == (1.0, 0.0):
            t = hi
        else:
            w = (b.add(Op.CONST, value=wr, name="w"), b.add(Op.CONST, value=wi, name="w"))
            t = _cmul(b, w, hi)
    else:
        ld = [b.add(Op.LOAD, buffer=buf, addr=Addr(tw.terms, tw.const + q * part_stride),
                    name=f"w{k}.{q}")
              for q in range(2)]
        t = _cmul(b, ld, hi)
    up = (b.add(Op.BFLY, (lo[0], t[0]), value=1.0, name="+"),
          b.add(Op.BFLY, (lo[1], t[1]), value=1.0, name="+"))
    dn = (b.add(Op.BFLY, (lo[0], t[0]), value=-1.0, name="-"),
          b.add(Op.BFLY, (lo[1], t[1]), value=-1.0, name="-"))
    return up, dn


def _cmul(b: _Body, w, x):
    """(wr + i wi)(xr + i xi): re = wr xr - wi xi (MUL, then a negating MAC), im = wr xi + wi xr
    (MUL, MAC)."""
    wr, wi = w
    re = b.add(Op.MAC, (wi, x[1], b.add(Op.MUL, (wr, x[0]))), value=-1.0)
    im = b.add(Op.MAC, (wr, x[1], b.add(Op.MUL, (wi, x[0]))))
    return re, im


def _matrix_pair(b: _Body, spec, lo, hi, base: Addr, buf):
    """[lo, hi] -> [[a, b], [c, d]] [lo, hi] with per-pair coefficients from `buf` at `base`."""
    def coef(q):
        return b.add(Op.LOAD, buffer=buf, addr=Addr(base.terms, base.const + q), name=f"{buf}.{q}")

    if spec.kind == ButterflyKind.REAL:
        a, bb, c, d = (coef(q) for q in range(4))
        up = b.add(Op.MAC, (a, lo[0], b.add(Op.MUL, (bb, hi[0]))))
        dn = b.add(Op.MAC, (c, lo[0], b.add(Op.MUL, (d, hi[0]))))
        return (up, None), (dn, None)
    def dot(terms):
        """sum sign * coef * value as MUL then MACs (a negative sign: a negating MAC); terms on
        an absent (zero) value are skipped; the first term taken is positive."""
        acc = None
        for sign, c, v in terms:
            if v is None:
                continue
            if acc is None and sign < 0:
                raise DFGError("a dot product must start with a positive term")
            acc = (b.add(Op.MUL, (c, v)) if acc is None
                   else b.add(Op.MAC, (c, v, acc), value=float(sign)))
        return acc

    out = []
    for row in range(2):
        (ar, ai), (br, bi) = [[coef(4 * row + 2 * col + q) for q in range(2)] for col in range(2)]
        # re = ar lo.re - ai lo.im + br hi.re - bi hi.im,
        # im = ar lo.im + ai lo.re + br hi.im + bi hi.re
        re = dot(((1, ar, lo[0]), (-1, ai, lo[1]), (1, br, hi[0]), (-1, bi, hi[1])))
        im = dot(((1, ar, lo[1]), (1, ai, lo[0]), (1, br, hi[1]), (1, bi, hi[0])))
        out.append((re, im))
    return out[0], out[1]


# --- data layout and tables ------------------------------------------------------------------

def to_blocks(x: np.ndarray, lanes: int, dtype=np.float32) -> np.ndarray:
    """(batch, n) -> flat [nb, n, L] (batch padded with zeros to a multiple of L)."""
    batch, n = x.shape
    nb = -(-batch // lanes)
    pad = np.zeros((nb * lanes, n), dtype=dtype)
    pad[:batch] = x
    return np.ascontiguousarray(pad.reshape(nb, lanes, n).transpose(0, 2, 1)).ravel()


def from_blocks(flat: np.ndarray, batch: int, n: int, lanes: int) -> np.ndarray:
    """Inverse of `to_blocks`: flat [nb, n, L] -> (batch, n)."""
    nb = -(-batch // lanes)
    return flat.reshape(nb, n, lanes).transpose(0, 2, 1).reshape(nb * lanes, n)[:batch]


def pack_data(spec: ButterflySpec, x: np.ndarray, index: int, groups: int,
              dtype=np.float32) -> dict[str, np.ndarray]:
    """The SPM image of data buffer `index` holding x (batch, n): {buffer name: flat words}.
    Natural layout [nb, n, L] per part; skewed: rows at skew_row(P), parts interleaved."""
    re_name, im_name = data_names(spec, index, groups)
    parts = [np.real(x)]
    if spec.complex_data and not (index == 0 and spec.real_input):
        parts.append(np.imag(x) if np.iscomplexobj(x) else np.zeros(x.shape))
    blocks = [to_blocks(q, spec.lanes, dtype).reshape(spec.blocks, spec.n, spec.lanes)
              for q in parts]
    if not is_skewed(spec, index, groups):
        out = {re_name: blocks[0].ravel()}
        if len(blocks) == 2:
            out[im_name] = blocks[1].ravel()
        return out
    rows = skew_rows(spec, index, groups)
    img = np.zeros((spec.blocks, data_rows(spec, True), len(blocks), spec.lanes), dtype=dtype)
    for c, blk in enumerate(blocks):
        img[:, rows, c, :] = blk
    return {re_name: img.ravel()}


def unpack_data(spec: ButterflySpec, words: dict, index: int, groups: int) -> np.ndarray:
    """(batch, n) values of data buffer `index` from its SPM image (inverse of `pack_data`)."""
    re_name, im_name = data_names(spec, index, groups)
    parts = data_parts(spec, index, groups)
    cplx = spec.complex_data and not (index == groups and spec.real_output)
    if is_skewed(spec, index, groups):
        rows = skew_rows(spec, index, groups)
        img = words[re_name].reshape(spec.blocks, data_rows(spec, True), parts, spec.lanes)[:, rows]
        blocks = [img[:, :, c, :].ravel() for c in range(parts)]
    else:
        blocks = [words[re_name]] + ([words[im_name]] if cplx else [])
    vals = [from_blocks(b, spec.batch, spec.n, spec.lanes) for b in blocks]
    return vals[0] + 1j * vals[1] if len(vals) == 2 else vals[0]


def coefficient_inputs(spec: ButterflySpec, factors=None, bias=None, dtype=np.float32,
                       groups: tuple[StageGroup, ...] | None = None) -> dict[str, np.ndarray]:
    """The coefficient buffers every group may read: T{k} / C{k} (fft) or F{k} (real/complex).
    FFT tables are laid out for the group that reads them (`twiddle_position`; `groups`
    None: one stage per group)."""
    out = {}
    p = spec.prefix
    first = {}
    for g in groups or split_stages(spec.stages, 1):
        first.update({k: g.first for k in range(g.first, g.first + g.count)})
    for k in range(spec.stages):
        pos = twiddle_position(np.arange(1 << k), k, first[k])
        if spec.kind == ButterflyKind.FFT and spec.col_bits:
            # column pass: block u = 2 pos + part of 2^cb + L words (one spare row, so the
            # blocks of one iteration's twiddles fall on successive SPM lines), k1 inside
            cb, kk = spec.col_bits, spec.col_bits + k
            blk = spec.col_block_words
            w = np.exp(-2j * np.pi * (np.arange(1 << k)[:, None] * (1 << cb) + np.arange(1 << cb))
                       / (2 << kk))
            t = np.zeros((1 << k, 2, blk))
            t[pos, 0, : 1 << cb] = w.real
            t[pos, 1, : 1 << cb] = w.imag
            out[f"{p}C{kk}"] = t.astype(dtype).ravel()
        elif spec.kind == ButterflyKind.FFT:
            w = np.exp(-2j * np.pi * np.arange(1 << k) / (2 << k))
            t = np.zeros((1 << k, 2))
            t[pos] = np.stack([w.real, w.imag], -1)
            out[f"{p}T{k}"] = t.astype(dtype).ravel()
        elif spec.kind == ButterflyKind.REAL:
            out[f"{p}F{k}"] = np.asarray(factors[k], dtype=dtype).reshape(-1)
        else:
            f = np.asarray(factors[k], dtype=np.complex128)
            out[f"{p}F{k}"] = np.stack([f.real, f.imag], -1).astype(dtype).reshape(-1)
    if spec.bias:
        out[f"{p}bias"] = np.asarray(bias, dtype=dtype).reshape(spec.n)
    return out


def lower_butterfly(spec: ButterflySpec, groups: tuple[StageGroup, ...], x: np.ndarray,
                    factors=None, bias=None, dtype=np.float32) -> Program:
    """Program of one kernel per group for `spec` applied to x (batch, n) (real or complex).

    Outputs: `Yr` (and `Yi` for complex data unless `real_output`) laid out [nb, n, L], or `Yc`
    in the skewed layout; `unpack_data(spec, outputs, G, G)` gives the (batch, n) values."""
    spec.verify()
    if sum(g.count for g in groups) != spec.stages or [g.first for g in groups] != \
            list(np.cumsum([0] + [g.count for g in groups[:-1]])):
        raise DFGError(f"stage groups {groups} must cover stages 0..{spec.stages - 1} in order")
    x = np.asarray(x)
    if x.ndim != 2 or x.shape != (spec.batch, spec.n):
        raise DFGError(f"x must have shape (batch, n) = ({spec.batch}, {spec.n}), got {x.shape}")
    G = len(groups)
    kernels = tuple(group_kernel(spec, g, G, i) for i, g in enumerate(groups))
    inputs = pack_data(spec, x, 0, G, dtype)
    needed = {bf.name for k in kernels for bf in k.buffers}
    coefficients = coefficient_inputs(spec, factors, bias, dtype, groups)
    inputs.update({k: v for k, v in coefficients.items() if k in needed})
    last = kernels[-1].buffer_map
    names = dict.fromkeys(data_names(spec, G, G))
    outputs = tuple((nm, (last[nm].size,)) for nm in names if nm in last)
    prog = Program(name=f"{spec.prefix}butterfly_{spec.kind}_n{spec.n}_b{spec.batch}",
                   kernels=kernels, inputs=tuple(inputs.items()), outputs=outputs,
                   dtype=np.dtype(dtype).name, macs=butterfly_macs(spec),
                   stage_groups=tuple(groups))
    return run_passes(prog)


def butterfly_macs(spec: ButterflySpec) -> int:
    """Useful multiplies of the product (closed form): per 2x2 block 4 real multiplies (real),
    16 (complex matrix), 4 per twiddle multiply (fft); lanes of padded batch rows excluded."""
    pairs = spec.batch * spec.stages * spec.n // 2
    per_pair = {ButterflyKind.REAL: 4, ButterflyKind.COMPLEX: 16, ButterflyKind.FFT: 4}
    return pairs * per_pair[spec.kind]


# the spec and layout helpers live in `butterfly_spec`; importers of this module keep finding them
__all__ = [
    "KINDS", "ButterflyKind", "ButterflySpec", "StageGroup", "butterfly_macs", "coefficient_inputs",
    "data_names", "data_parts", "data_rows", "from_blocks", "group_kernel", "is_skewed",
    "lower_butterfly", "pack_data", "skew_mask", "skew_period", "skew_permutation", "skew_row",
    "skew_rows", "skew_weight", "split_stages", "to_blocks", "twiddle_bit", "twiddle_position",
    "unpack_data",
]
