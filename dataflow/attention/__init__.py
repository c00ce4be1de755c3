"""Structured-sparse attention: patterns as UST masks, lowered SDDMM -> masked softmax -> SpMM.

`sparse_attention(q, k, v, pattern=..., backend="numpy"|"sim", lowering="csr"|"dia"|"auto")`;
the `attention` workload (`dataflow simulate --workload attention --pattern window --seq 128
--dim 32`); `SparseAttention`, the plan/execute op behind the sim backend.
"""

from dataflow.attention.api import (
    attention_reference,
    compute_bound_cycles,
    make_inputs,
    mask_csr,
    phase_cycles,
    sparse_attention,
)
from dataflow.attention.lower import lower_attention
from dataflow.attention.lower_dia import band_offsets, lower_attention_dia
from dataflow.attention.op import SparseAttention
from dataflow.attention.patterns import (
    PATTERNS,
    AttentionPattern,
    PatternError,
    pattern_mask,
    resolve,
)

__all__ = ["PATTERNS", "AttentionPattern", "PatternError", "SparseAttention",
           "attention_reference", "band_offsets", "compute_bound_cycles", "lower_attention",
           "lower_attention_dia", "make_inputs", "mask_csr", "pattern_mask", "phase_cycles",
           "resolve", "sparse_attention"]
