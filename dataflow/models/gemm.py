"""GEMM layers (`LayerKind.GEMM`, sizes m, k, n): input ``m x k`` times the "weight" ``k x n``
(plus an optional "bias" ``(n,)``), through the ordinary GEMM path on every preset. A SCALE-Sim
GEMM row ``M, N, K`` is this layer with ifmap ``M x K`` and filter ``K x N``."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from dataflow.arch import ArchSpec, PEKind
from dataflow.matmul_split import matmul_work, plan_split
from dataflow.models.layers import Layer, LayerKind, ModelError
from dataflow.models.runners import RunOptions
from dataflow.pe_array.result import SimResult
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.plan.split import inorder_matmul, run_split
from dataflow.ust_frontend.ops import as_tensor, lower_matmul


def gemm_dims(layer: Layer) -> tuple[int, int, int]:
    """(m, k, n) of a GEMM layer."""
    if layer.kind != LayerKind.GEMM:
        raise ModelError(f"{layer.where}: layer {layer.name!r} is {layer.kind}, not gemm")
    return layer.size("m"), layer.size("k"), layer.size("n")


def input_shape(layer: Layer) -> tuple[int, int]:
    m, k, _ = gemm_dims(layer)
    return m, k


def weight_shapes(layer: Layer) -> dict[str, tuple[int, ...]]:
    """"weight" (k, n); "bias" (n,) is optional."""
    _, k, n = gemm_dims(layer)
    return {"weight": (k, n)}


def simulate_gemm(a: np.ndarray, b: np.ndarray, arch: ArchSpec, options: RunOptions,
                  name: str, a_addresses: np.ndarray | None = None
                  ) -> tuple[np.ndarray, SimResult]:
    """One dense (m x k) @ (k x n) on `arch` through the ordinary GEMM path (lowered, mapped,
    simulated with `options.engine`; `options.dataflow` on systolic arrays only): the product
    in fp32 and the engine's result. The GEMM and conv layer runners both run here.
    `a_addresses` (m x k) say which elements of A are one word in memory (an im2col's repeated
    pixels), for the systolic memory model (`GemmShape.a_addresses`)."""
    a = np.ascontiguousarray(a, np.float32)
    b = np.ascontiguousarray(b, np.float32)
    systolic = arch.pe_array.kind == PEKind.SYSTOLIC
    key = (id(arch), a.shape, b.shape[1], options.engine)
    memo = not systolic and a_addresses is None and gemm_memo_enabled()
    if memo and key in _SHAPE_MEMO and _SHAPE_MEMO[key][0] is arch and _verified(key):
        out = inorder_matmul(a, b)
        res = _SHAPE_MEMO[key][1]
        return out, dataclasses.replace(res, output=out, workload=name,
                                        notes=(*res.notes, SHAPE_MEMO_NOTE))
    if not systolic:  # too large for the SPM (BERT's FFN weight): in blocks that fit
        split = _split_gemm(a, b, arch, options, name)
        if split is not None:
            _memoise(key, memo, arch, a, b, *split)
            return split
    program = lower_matmul(as_tensor(a), as_tensor(b))
    if a_addresses is not None and program.gemm is not None:
        program = dataclasses.replace(program, gemm=dataclasses.replace(
            program.gemm, a_addresses=np.asarray(a_addresses, np.int64)))
    mapping = compile_program(program, arch, dataflow=options.dataflow if systolic else None)
    res = simulate_mapping(mapping, engine=options.engine, workload=name)
    out = res.output.reshape(a.shape[0], b.shape[1])
    res = dataclasses.replace(res, mapping_summary=mapping.summary())
    _memoise(key, memo, arch, a, b, out, res)
    return out, res


#: Dense GEMMs of a shape already simulated on an arch in this process (a model's Q, K, V and
#: output projections share one): (id(arch), A's shape, n, engine) -> (arch, result).
#: docs/architecture.md#model-layers-split-gemms-and-a-shape-memo
_SHAPE_MEMO: dict[tuple, tuple[ArchSpec, SimResult]] = {}
_SHAPE_MEMO_KEEP = 16
#: Switch of the shape memo: on unless this environment variable is 0, false, no or off.
GEMM_MEMO_ENV = "DATAFLOW_GEMM_MEMO"
SHAPE_MEMO_NOTE = ("timing of an earlier GEMM of this shape on this arch reused (a dense GEMM's "
                   "addresses, so its timing, do not depend on its values); values computed in "
                   "the kernel's order, which that run matched bit for bit")


def gemm_memo_enabled() -> bool:
    return os.environ.get(GEMM_MEMO_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _memoise(key, memo: bool, arch: ArchSpec, a: np.ndarray, b: np.ndarray, out: np.ndarray,
             res: SimResult) -> None:
    """Keep a dense GEMM's result for later GEMMs of its shape, when the engine's values are
    exactly `inorder_matmul`'s (the order a later hit computes them in). The check runs at the
    first later GEMM of the shape (`_verified`), not here: a shape met once (BERT's FFN GEMMs)
    never pays it; until then the operands and output are kept (`_UNVERIFIED`, the last
    `_UNVERIFIED_KEEP` entries)."""
    if not memo:
        return
    _UNVERIFIED.pop(key, None)
    _CHECKED.discard(key)
    _UNVERIFIED[key] = (a, b, np.asarray(out, np.float32))
    while len(_UNVERIFIED) > _UNVERIFIED_KEEP:  # host memory: a few GEMMs' operands
        del _UNVERIFIED[next(iter(_UNVERIFIED))]
    _SHAPE_MEMO[key] = (arch, dataclasses.replace(res, output=None))
    while len(_SHAPE_MEMO) > _SHAPE_MEMO_KEEP:
        del _SHAPE_MEMO[next(iter(_SHAPE_MEMO))]


#: shape-memo entries whose values have not yet been compared with `inorder_matmul`'s:
#: key -> (A, B, the engine's output)
_UNVERIFIED: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
_UNVERIFIED_KEEP = 4
#: shape-memo entries whose values were found equal to `inorder_matmul`'s
_CHECKED: set[tuple] = set()


def _verified(key) -> bool:
    """Whether entry `key` may be reused: its run's values are bit for bit `inorder_matmul`'s
    (checked once, at its first reuse; an entry whose operands were dropped unchecked, or that
    fails, is forgotten)."""
    if key in _UNVERIFIED:
        a, b, out = _UNVERIFIED.pop(key)
        if np.array_equal(out.view(np.int32), inorder_matmul(a, b).view(np.int32)):
            _CHECKED.add(key)
            return True
    elif key in _CHECKED:
        return True
    _SHAPE_MEMO.pop(key, None)
    _CHECKED.discard(key)
    return False


def _split_gemm(a: np.ndarray, b: np.ndarray, arch: ArchSpec, options: RunOptions,
                name: str) -> tuple[np.ndarray, SimResult] | None:
    """The product and result of a GEMM that does not fit the SPM whole, run as the `gemm`
    workload runs one (`dataflow.matmul_split`: K panels and N blocks, blocks of one shape
    memoised); None when it fits, or when its operands would have to be streamed."""
    (m, k), n = a.shape, b.shape[1]
    split = plan_split("gemm", arch, m, k, n)
    if split is None or split.streamed:
        return None
    work = matmul_work(split, "gemm", 1.0, 0, lambda *_: (a, b))
    res = run_split(split, work, arch, engine=options.engine)
    if res.output is None:
        return None
    out = np.asarray(res.output, np.float32).reshape(m, n)
    return out, dataclasses.replace(res, workload=name)


def check_weight(layer: Layer, weights: dict[str, np.ndarray]) -> None:
    """A GEMM layer with declared sizes takes a "weight" of (k, n) when it has one."""
    if "weight" not in weights or "k" not in dict(layer.sizes):
        return
    _, k, n = gemm_dims(layer)
    got = tuple(np.shape(weights["weight"]))
    if got != (k, n):
        raise ModelError(f"{layer.where}: gemm layer {layer.name!r}: 'weight' must be "
                         f"({k}, {n}), got {got}")
