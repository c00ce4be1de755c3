"""Structured-sparse attention: patterns as UST masks, lowered SDDMM -> masked softmax -> SpMM.

`sparse_attention(q, k, v, pattern=..., backend="numpy"|"sim")`; the `attention` workload
(`dataflow simulate --workload attention --pattern window --seq 128 --dim 32`).
"""

from dataflow.attention.api import (
    attention_reference,
    compute_bound_cycles,
    phase_cycles,
    sparse_attention,
)
from dataflow.attention.lower import lower_attention
from dataflow.attention.patterns import (
    PATTERNS,
    AttentionPattern,
    PatternError,
    pattern_mask,
    resolve,
)

__all__ = ["PATTERNS", "AttentionPattern", "PatternError", "attention_reference",
           "compute_bound_cycles", "lower_attention", "pattern_mask", "phase_cycles", "resolve",
           "sparse_attention"]
