"""Planning: searches that run the mapper and the engine to choose how a workload runs
(docs/architecture.md#layers, layer 5). They sit above both, so neither the mapper nor the
engine imports anything from here.

- `orchestrate`: layer-by-layer, stage-fused or multi-layer butterfly orchestration, and how
  many stages per kernel and kernels per residency the architecture allows;
- `spm_layout`: the skewed SPM layout of multi-layer butterfly buffers, chosen against the
  mapped schedule by measuring the engine's stalls (kept on disk beside the plan cache);
- `stage_mapping`: stage kernels mapped once per body and reused;
- `split`: a matmul too large for the SPM or the host cut into M tiles, N blocks and K
  panels, run back to back, identical blocks' timing memoised
  (docs/conventions.md#tiling-any-problem-size).
"""
