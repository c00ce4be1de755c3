"""`SparseAttention`: masked attention as a stateful frontend op (plan once, execute often).

Planning (lower + map) depends on the shapes of q, k, v, the mask's structure and the arch,
never on values, so plans go through the frontend's plan cache (memory and disk, see
`dataflow.ust_frontend.cache`) like `Matmul` and `Sddmm` do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.attention.block_fill import find_cover, useful_fraction
from dataflow.attention.lower import lower_attention
from dataflow.attention.lower_block import find_blocks, held_words, lower_attention_block
from dataflow.attention.lower_dia import band_offsets, lower_attention_dia
from dataflow.attention.reference import attention_reference
from dataflow.attention.row_softmax import held_words as row_held_words
from dataflow.attention.row_softmax import row_width
from dataflow.errors import UserError
from dataflow.plan.gemm_schedule import supports
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.ops import _StatefulOp, as_tensor
from dataflow.ust_frontend.tensor import Tensor

# The cache's code fingerprint covers dfg/, mapper/ and arch/; this lowering lives elsewhere,
# so its source hash goes into the op name (and thus the plan key): editing it retires old plans.
_LOWERING_SHA = hashlib.sha256(b"".join(
    (Path(__file__).resolve().parent / f).read_bytes()
    for f in ("lower.py", "lower_dia.py", "lower_block.py", "block_fill.py",
              "row_softmax.py")
)).hexdigest()[:12]
LOWERINGS = ("csr", "dia", "block", "auto", "default")
#: SIMD lanes the block lowering's bodies take (one SPM row of a strip: `lower_block.BODY_ROWS`)
BLOCK_LANES = 8
#: most of the SPM the block lowering's held intermediates may take (the rest: the kernels'
#: streamed windows)
ON_CHIP_FRACTION = 0.75
#: least useful fraction (attended / covered entries) at which `auto` and `default` run a mask
#: that is not whole blocks through the block lowering with masked fillers, by whether the
#: array has an accmax unit (docs/conventions.md#block-attention, "Filler blocks"; measured)
FILL_THRESHOLD = {"accmax": 0.5, "no_accmax": 0.3}


class SparseAttention(_StatefulOp):
    """O = softmax(mask(Q K^T / sqrt(d))) V with `mask` given by its CSR arrays (pos, crd).

    `lowering`: "csr" (any mask: SDDMM, softmax and SpMM over the CSR entries, `lower.py`;
    rows of one width: a row-body softmax, `row_softmax.py`),
    "dia" (a mask of whole, equally spaced diagonals: affine, gather-free, `lower_dia.py`),
    "block" (a mask of whole aligned blocks of a multiple of 8, bigbird: gathered GEMMs over
    the kept blocks, `lower_block.py`; or a mask covered by the blocks it touches, the fillers
    masked by a -inf bias, `block_fill.py`), "auto" (filler blocks where their useful fraction
    reaches `FILL_THRESHOLD`, else dia where the mask allows it, else block, else csr) or
    "default" (block where the mask is whole blocks, not all of them, or its covering reaches
    `FILL_THRESHOLD`, and the arch has 8 lanes, else csr; what the `attention` workload
    runs). `execute(backend="numpy")` is the dense
    masked reference; `"sim"` runs the planned mapping on the fast engine (`last_result` holds
    the SimResult)."""

    def __init__(self, q, k, v, pos: np.ndarray, crd: np.ndarray, lowering: str = "csr"):
        super().__init__()
        if lowering not in LOWERINGS:
            raise UserError(f"lowering must be one of {LOWERINGS}, got {lowering!r}")
        self._lanes = None
        self._capacity = None
        self._accmax = True
        self._fill = False
        self.requested_lowering = lowering
        self.reset_operands(q, k, v, pos, crd)

    def reset_operands(self, q=None, k=None, v=None, pos=None, crd=None) -> None:
        """New values; the plan stays valid while the shapes and the mask's structure do."""
        if q is not None:
            self.q = np.ascontiguousarray(q, dtype=np.float32)
        if k is not None:
            self.k = np.ascontiguousarray(k, dtype=np.float32)
        if v is not None:
            self.v = np.ascontiguousarray(v, dtype=np.float32)
        if pos is not None or crd is not None:
            self.pos = np.asarray(pos, dtype=np.int64)
            self.crd = np.asarray(crd, dtype=np.int64)
        shape = (self.q.shape[0], self.k.shape[0])
        # the structure the kernels walk, as a CSR tensor: its pos/crd bytes key the plan
        self.mask = Tensor(NamedFormats.CSR, shape, [None, self.pos], [None, self.crd],
                           np.ones(len(self.crd), dtype=np.float32))
        self._blocks = None
        self._fill = False
        self._resolve()

    def _resolve(self) -> None:
        """The lowering that runs (`requested_lowering` resolved against the mask and, once
        planned, the arch's lanes) and the op name that keys its plans."""
        shape = (self.q.shape[0], self.k.shape[0])
        self.lowering = self.requested_lowering
        if self.lowering in ("block", "auto", "default") and self._blocks is None:
            self._blocks = find_blocks(self.pos, self.crd, *shape) or ()
            self._fill = False
            if not self._blocks:  # covered by the blocks it touches, fillers masked
                self._blocks = find_cover(self.pos, self.crd, *shape) or ()
                self._fill = bool(self._blocks)
        lanes_ok = self._lanes in (None, BLOCK_LANES)
        # picked (auto, default) only where some block is left out: a mask of every block
        # (dense) would copy all of K once per panel into K_c
        sparse = bool(self._blocks) and len(self._blocks[2]) < (shape[0] * shape[1]
                                                                  // self._blocks[0] ** 2)
        if self._fill:  # and, with fillers, only where enough of the blocks is attended
            sparse = sparse and self.useful_fraction() >= self._fill_threshold()
            # a filler multiplies its key's K and V row too (its E is 0): 0 * inf is NaN, so
            # a non-finite K or V value would reach rows that do not attend it
            finite = bool(np.isfinite(self.k).all() and np.isfinite(self.v).all())
            if not finite and self.lowering == "block":
                raise UserError("lowering='block' over a mask that is not whole blocks "
                                 "computes filler entries with every key of a touched block; "
                                 "K or V holds inf or NaN, which would reach rows that do not "
                                 "attend it; use lowering='csr'")
            sparse = sparse and finite
        if self.lowering == "block" and not (self._blocks and lanes_ok):
            raise UserError("lowering='block' needs a mask of whole aligned blocks whose edge "
                             f"is a multiple of {BLOCK_LANES} (bigbird), or one whose touched "
                             "blocks' rows each attend a key, on an array of "
                             f"{BLOCK_LANES} SIMD lanes; use lowering='csr' or 'auto'")
        if self.lowering == "default":
            self.lowering = "block" if sparse and lanes_ok else "csr"
        if self.lowering in ("dia", "auto"):
            band = band_offsets(self.pos, self.crd, shape[1]) if shape[0] == shape[1] else None
            if self.lowering == "dia" and band is None:
                raise UserError("lowering='dia' needs a square mask of whole, equally spaced "
                                 "diagonals (window, dilated); use lowering='csr' or 'auto'")
            # auto: DIA walks T * seq positions, fillers included; worth it while they are few
            # (a narrow band), not for e.g. the dense mask (2 seq - 1 diagonals, half fillers)
            # (filler blocks picked are measured faster than dia, `FILL_THRESHOLD`)
            if self.lowering == "auto":
                few = band is not None and band[2] * shape[0] <= 1.5 * len(self.crd)
                self.lowering = ("block" if sparse and lanes_ok and self._fill
                                 else "dia" if few
                                 else "block" if sparse and lanes_ok else "csr")
        # the block lowering hands its intermediates over in the SPM when they fit
        # (`lower_block.held_words`), else through DRAM: part of the plan's name
        where = ""
        if self.lowering == "block" and not self._on_chip():
            where = ":dram"
        if self.lowering == "csr" and self._row_bodies():  # docs/conventions.md#row-softmax
            where = ":rows" if self._rows_on_chip() else ":rows:dram"
        self.op = f"attention:{self.lowering}{where}:{_LOWERING_SHA}"

    def useful_fraction(self) -> float:
        """Attended entries over the block lowering's covered entries (1.0: whole blocks)."""
        if not self._blocks:
            return 0.0
        return useful_fraction(len(self.crd), len(self._blocks[2]), self._blocks[0])

    def _fill_threshold(self) -> float:
        """The useful fraction from which filler blocks are picked on this array
        (`FILL_THRESHOLD`, by whether it has an accmax unit)."""
        return FILL_THRESHOLD["accmax" if self._accmax else "no_accmax"]

    def _on_chip(self) -> bool:
        if self._capacity is None or not self._blocks:
            return True
        edge, _, bcrd = self._blocks
        if not self._accmax:  # Q held under St in the scores' kernel (`held_layout`)
            held = held_words(self.q.shape[0], edge, len(bcrd), self.q.size)
            return held <= ON_CHIP_FRACTION * self._capacity
        held = held_words(self.q.shape[0], edge, len(bcrd))
        # beside the widest whole operand: Q (gathered by the sddmm) or V (by the spmm)
        whole = max(self.q.size, self.v.size)
        return held + whole <= ON_CHIP_FRACTION * self._capacity

    def _row_bodies(self) -> bool:
        """The CSR lowering's row-body softmax (`row_softmax.py`): rows of one width, on any
        array (measured faster than the CSR softmax with and without an accmax unit,
        docs/conventions.md#row-softmax)."""
        return row_width(self.pos) is not None

    def _rows_on_chip(self) -> bool:
        """Whether the row-body program's S and P fit the SPM beside the widest whole
        operand (K for the sddmm, V for the spmm), within `ON_CHIP_FRACTION`."""
        if self._capacity is None:
            return True
        lanes = self._lanes or 1
        whole = self.k.shape[0] * max(-(-self.k.shape[1] // lanes) * lanes, self.v.shape[1])
        held = row_held_words(self.q.shape[0], len(self.crd))
        return held + whole <= ON_CHIP_FRACTION * self._capacity

    def _operands(self):
        return (as_tensor(self.q), as_tensor(self.k), as_tensor(self.v), self.mask)

    def plan(self, arch=None, backend: str = "sim", *, dataflow=None, cache=None):
        if backend == "sim":
            arch = resolve_arch(arch)
            self.set_arch(arch)
        return super().plan(arch, backend, dataflow=dataflow, cache=cache)

    def set_arch(self, arch) -> None:
        """Resolve the lowering for `arch` (its lanes, SPM capacity and accmax unit)."""
        self._lanes = arch.pe_array.simd_lanes  # the SDDMM's reduction width
        self._capacity = arch.spm.capacity_words
        self._accmax = supports(arch, "accmax")
        self._resolve()

    def _lower(self):
        if self.lowering == "block":
            return lower_attention_block(self.q, self.k, self.v, self.pos, self.crd,
                                         edge=self._blocks[0], on_chip=self._on_chip(),
                                         accmax=self._accmax, fill=self._fill)
        if self.lowering == "dia":
            return lower_attention_dia(self.q, self.k, self.v, self.pos, self.crd,
                                       lanes=self._lanes or 1)
        return lower_attention(self.q, self.k, self.v, self.pos, self.crd,
                               lanes=self._lanes or 1, row_bodies=self._row_bodies(),
                               on_chip=self._rows_on_chip())

    def _reference(self) -> np.ndarray:
        return attention_reference(self.q, self.k, self.v, self.pos, self.crd)

    def _finish(self, raw) -> np.ndarray:
        return np.asarray(raw, dtype=np.float32)
