"""What a butterfly program is and where its data sits: `ButterflySpec` (length, batch, lanes,
kind, the stage layout) and the skewed SPM layout of the buffers between stage groups (see
`dataflow.dfg.lower_butterfly`, whose module docstring describes both)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from dataflow.dfg.graph import DFGError, StageGroup


class ButterflyKind(str, Enum):
    """`ButterflySpec.kind`: what the 2x2 blocks of each stage are (module docstring)."""

    FFT = "fft"  # twiddle multiplies of a radix-2 DIT
    REAL = "real"  # real 2x2 factors, 4 words per pair
    COMPLEX = "complex"  # complex 2x2 factors, 8 words per pair

    def __str__(self) -> str:  # program names and messages print the word
        return self.value


KINDS = tuple(k.value for k in ButterflyKind)


@dataclass(frozen=True)
class ButterflySpec:
    """One butterfly product over a batch: what the lowering needs, no data.

    `bitrev_input`: the first group reads the input in bit-reversed order (the FFT).
    `real_input`: the input has no imaginary part (complex kinds): CONST 0, nothing loaded.
    `real_output`: store only the real part (FNet keeps Re). `bias`/`relu`: epilogue of the
    last stage (butterfly linear layer / FFN; kind `real` only). `skew_lines` (a power of two,
    0 = off): buffers between groups use the skewed layout `skew_row` so that the 2^f points of a
    sub-butterfly (a power-of-two stride apart) fall on different lines of an interleaved SPM
    with that many lines; input and output stay in the natural layout (they cross DRAM).
    `skew_perm` (one permutation of range(stages) per data buffer, X0 .. X(G-1), Y; empty =
    identity): buffer i gives index bit q the skew weight of bit perm_i[q], so its
    layout is the skewed layout of the bit-permuted index: still one-to-one on the same rows.
    `skew_flip` (a bit mask per data buffer): buffer i holds point P at the row of P xor
    mask_i (in the affine address a flipped bit b is w_b - w_b bit_b: a negative coefficient),
    again one-to-one on the same rows, with other line residues (-w mod lines).
    The orchestrator picks the permutations and masks against the mapped schedule so that stores
    issued in one cycle land on different SPM lines (`plan.spm_layout.choose_layout`).
    `col_bits` = a > 0 (kind `fft` only): this is the *column pass* of a four-step split of an
    FFT of size N = n 2^a (`butterfly.ops.run_fft_spec`): batch rows are (b, k1), k1 < 2^a the
    fastest, and local stage j is stage a + j of the N-point DIT, whose twiddle
    W_(2^(a+j+1))^((P mod 2^j) 2^a + k1) depends on the row's k1 as well as the point P. The
    outer loop then runs over b (`outer`) and a loop `kh` over the 2^a / lanes blocks of one b,
    so that k1 = kh lanes + bi is affine; the tables C{a+j} hold blocks of `col_block_words`
    (2^a twiddles for consecutive k1, then a spare row), one block per (twiddle place, part), so
    a twiddle vector (8 consecutive k1) is one SPM row and successive blocks start on successive
    SPM lines.
    """

    n: int
    batch: int
    lanes: int
    kind: ButterflyKind = ButterflyKind.FFT  # a plain "fft" compares equal (str enum)
    bitrev_input: bool = False
    real_input: bool = False
    real_output: bool = False
    bias: bool = False
    relu: bool = False
    prefix: str = ""
    skew_lines: int = 0
    skew_perm: tuple[tuple[int, ...], ...] = ()
    skew_flip: tuple[int, ...] = ()
    col_bits: int = 0

    @property
    def stages(self) -> int:
        return self.n.bit_length() - 1

    @property
    def blocks(self) -> int:
        return -(-self.batch // self.lanes)

    @property
    def col_blocks(self) -> int:
        """Batch blocks per outer index: 2^col_bits / lanes for a column pass, else 1."""
        return (1 << self.col_bits) // self.lanes if self.col_bits else 1

    @property
    def col_block_words(self) -> int:
        """Words of one block of a column pass's twiddle table: 2^col_bits values (one per k1)
        and a spare row of `lanes` words."""
        return (1 << self.col_bits) + self.lanes

    @property
    def outer(self) -> int:
        """Extent of the outer (tiled) loop `bo`."""
        return self.blocks // self.col_blocks

    @property
    def complex_data(self) -> bool:
        return self.kind != ButterflyKind.REAL

    def verify(self) -> None:
        if self.kind not in KINDS:
            raise DFGError(f"butterfly kind must be one of {KINDS}, got {self.kind!r}")
        if self.n < 2 or self.n & (self.n - 1):
            raise DFGError(f"butterfly size n must be a power of two >= 2, got {self.n}")
        if self.skew_lines and (self.skew_lines < 2 or self.skew_lines & (self.skew_lines - 1)):
            raise DFGError(f"skew_lines must be 0 or a power of two >= 2, got {self.skew_lines}")
        for p in self.skew_perm:
            if p and sorted(p) != list(range(self.stages)):
                raise DFGError(f"skew_perm entries must be permutations of range({self.stages}) "
                               f"(or empty), got {p}")
        if any(not 0 <= m < self.n for m in self.skew_flip):
            raise DFGError(f"skew_flip masks must lie in [0, {self.n}), got {self.skew_flip}")
        if self.batch < 1 or self.lanes < 1:
            raise DFGError(f"batch and lanes must be >= 1, got {self.batch}, {self.lanes}")
        if (self.bias or self.relu) and self.kind != ButterflyKind.REAL:
            raise DFGError("bias/relu epilogues are for kind 'real' (butterfly linear / FFN)")
        if self.col_bits:
            n1 = 1 << self.col_bits
            if (self.kind != ButterflyKind.FFT or self.col_bits < 0 or n1 % self.lanes
                    or self.batch % n1):
                raise DFGError(f"a column pass (col_bits={self.col_bits}) needs kind 'fft', "
                               f"2^col_bits a multiple of lanes ({self.lanes}) and batch "
                               f"({self.batch}) a multiple of 2^col_bits")


def skew_weight(bit: int, lines: int) -> int:
    """Row weight of index bit `bit` in the skewed layout row(P) = sum_d P >> (d log2 lines):
    one spare row every `lines` rows, recursively, so P and P + 2^k sit on different lines."""
    z = lines.bit_length() - 1
    return sum(1 << (bit - d * z) for d in range(bit // z + 1))


def skew_row(p: int, lines: int) -> int:
    z = lines.bit_length() - 1
    return sum(p >> (d * z) for d in range(64 // max(1, z)) if p >> (d * z))


def skew_period(spec: ButterflySpec) -> int:
    """Lines one point's rows rotate over: complex intermediates keep re and im in adjacent rows
    (one buffer, row 2 row(P) + part), so their points rotate over half the lines."""
    return spec.skew_lines // 2 if spec.complex_data else spec.skew_lines


def data_rows(spec: ButterflySpec, skewed: bool) -> int:
    """Rows (of L words) one batch block of one part (re or im) of a data buffer spans."""
    return skew_row(spec.n - 1, skew_period(spec)) + 1 if skewed else spec.n


def is_skewed(spec: ButterflySpec, index: int, groups: int) -> bool:
    """Data buffer `index` (0 = input, groups = output) uses the skewed layout (all of them when
    `skew_lines` is set: the DMA moves only the real rows to and from DRAM)."""
    return skew_period(spec) > 1


def skew_permutation(spec: ButterflySpec, index: int, groups: int) -> tuple[int, ...]:
    """Index bit q of data buffer `index` (0 = input .. groups = output) takes the skew weight
    of bit perm[q] (identity when `skew_perm` has no entry for it)."""
    if index < len(spec.skew_perm) and spec.skew_perm[index]:
        return tuple(spec.skew_perm[index])
    return tuple(range(spec.stages))


def skew_rows(spec: ButterflySpec, index: int, groups: int) -> np.ndarray:
    """Row of every point P of skewed data buffer `index`: sum of the weights of P's bits."""
    perm = skew_permutation(spec, index, groups)
    w = np.array([skew_weight(perm[q], skew_period(spec)) for q in range(spec.stages)], np.int64)
    p = np.arange(spec.n) ^ skew_mask(spec, index)
    bits = (p[:, None] >> np.arange(spec.stages)[None, :]) & 1
    return bits @ w


def skew_mask(spec: ButterflySpec, index: int) -> int:
    """Bits of P flipped in data buffer `index`'s layout (0 when `skew_flip` has no entry)."""
    return spec.skew_flip[index] if index < len(spec.skew_flip) else 0


def data_parts(spec: ButterflySpec, index: int, groups: int) -> int:
    """2 when data buffer `index` holds re and im rows interleaved (complex, skewed), else 1."""
    if not spec.complex_data or not is_skewed(spec, index, groups):
        return 1
    if (index == 0 and spec.real_input) or (index == groups and spec.real_output):
        return 1
    return 2


def split_stages(stages: int, per_group: int) -> tuple[StageGroup, ...]:
    """Stages 0..stages-1 in groups of `per_group` (the last may be shorter)."""
    if per_group < 1:
        raise DFGError(f"stages per kernel must be >= 1, got {per_group}")
    return tuple(StageGroup(k, min(per_group, stages - k)) for k in range(0, stages, per_group))


def data_names(spec: ButterflySpec, index: int, groups: int) -> tuple[str, str]:
    """Buffer names (re, im) of the data between groups: X0 in, X1 .. X(G-1), Y out."""
    base = f"{spec.prefix}Y" if index == groups else f"{spec.prefix}X{index}"
    if data_parts(spec, index, groups) == 2:
        return base + "c", base + "c"  # re and im rows interleaved in one buffer
    return base + "r", base + "i"
