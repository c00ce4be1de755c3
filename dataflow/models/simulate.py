"""`simulate(model_or_file, arch=...)`: a whole model, layer by layer, on one architecture
(docs/architecture.md#models).

Every layer runs through the runner registry (`dataflow.models.runners`) on the real output
values of the layers it reads, so each layer's values are checked against its numpy reference
and a PyTorch model's output against PyTorch's own.

Between layers (`handoffs`): each layer's result is that of a standalone run, which reads its
inputs from DRAM and writes its output back. A producer's output then stays in the SPM when

    output words + max over the layers from the next one to its last reader of
    (that layer's working set: the words of its inputs other than this output, its weights
    and its own output)  <=  SPM capacity words (lines x capacity_words_per_line)

and otherwise makes a DRAM round trip, which the standalone runs already count. For an output
kept in the SPM, the producer's result loses min(output bytes, its DRAM bytes written) and
every reader's loses min(output bytes, its remaining DRAM bytes read); each layer's DRAM stall
cycles (and so its cycles) drop by min(its DRAM stall cycles, ceil(bytes saved / DRAM bytes
per cycle)), its DRAM floor by bytes saved / bytes per cycle, its DRAM energy by bytes saved x
dram_byte_pj. The model's output is always written back. Each choice is a note of the result.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dataflow.arch import ArchSpec, resolve_arch
from dataflow.models import conv as _conv  # noqa: F401 (registers the conv2d runner)
from dataflow.models.files import load_model
from dataflow.models.layers import MODEL_INPUT, Layer, LayerKind, Model, ModelError
from dataflow.models.ops import make_weights
from dataflow.models.result import Activation, LayerResult, ModelResult
from dataflow.models.runners import LayerRun, RunOptions, runner_for
from dataflow.models.torch_capture import CapturedModel, Feed, from_torch
from dataflow.pe_array.result import Roofline, SimResult
from dataflow.pe_array.simulate import ENGINES
from dataflow.testing import max_abs_error, values_match


def _is_torch_module(x) -> bool:
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module"
               for c in type(x).__mro__)


def layer_input(layer: Layer, rng: np.random.Generator) -> np.ndarray:
    """A seeded input for a layer that reads the model input: token ids for an embedding,
    (1, c, h, w) for a convolution, a matrix otherwise."""
    k = layer.kind
    if k == LayerKind.EMBEDDING:
        return rng.integers(0, layer.size("vocab"), size=layer.size("tokens"))
    shapes = {LayerKind.GEMM: ("m", "k"), LayerKind.MOE: ("tokens", "dim"),
              LayerKind.ELEMENTWISE: ("rows", "cols")}
    if k == LayerKind.CONV2D:
        shape = (1, layer.size("c"), layer.size("h"), layer.size("w"))
    elif k == LayerKind.ATTENTION:
        shape = (layer.size("seq"), layer.size("heads") * layer.size("head_dim"))
    else:
        shape = tuple(layer.size(s) for s in shapes[k])
    return rng.standard_normal(shape).astype(np.float32)


def model_input(model: Model, rng: np.random.Generator) -> np.ndarray:
    """A seeded input for a model that comes without one, shaped for its first reader."""
    first = next((la for la in model.layers if MODEL_INPUT in la.inputs), None)
    if first is None:
        raise ModelError(f"{model.source or model.name}: no layer reads the model input")
    return layer_input(first, rng)


def _own_inputs(model: Model, example: np.ndarray, rng) -> dict[str, np.ndarray]:
    """Seeded inputs of the layers that read the model input but take another shape than it:
    the independent rows of a SCALE-Sim topology file, each a layer of its own there."""
    out = {}
    for la in model.layers:
        if MODEL_INPUT in la.inputs and la.kind != LayerKind.EMBEDDING:
            x = layer_input(la, rng)
            if x.shape != example.shape:
                out[la.name] = x
    return out


def bind(model_or_file, inputs=None, seed: int = 0, **sizes) -> CapturedModel:
    """The model with its values, from each source: a PyTorch module (with `inputs` as its
    example inputs), a model file path, a `Model` (seeded weights and input) or a
    `CapturedModel` as it is. Another source is one more branch here."""
    if isinstance(model_or_file, CapturedModel):
        return model_or_file
    if _is_torch_module(model_or_file):
        if inputs is None:
            raise ModelError(f"{type(model_or_file).__name__}: a PyTorch model needs "
                             "inputs=(example tensor,)")
        return from_torch(model_or_file, inputs)
    if isinstance(model_or_file, (str, Path)):
        model = load_model(model_or_file, **sizes)
    elif isinstance(model_or_file, Model):
        model = model_or_file.verify()
    else:
        raise ModelError(f"simulate takes a Model, a model file or a PyTorch module, got "
                         f"{type(model_or_file).__name__}")
    rng = np.random.default_rng(seed)
    x = np.asarray(inputs) if inputs is not None else model_input(model, rng)
    weights = {la.name: make_weights(la, rng) for la in model.layers}
    feeds = {la.name: tuple(Feed(i) for i in la.inputs) for la in model.layers}
    return CapturedModel(model, weights, feeds, Feed(model.layers[-1].name), x,
                         reference_output=None, notes=model.notes)


def _with_pattern(model: Model, pattern: str | None) -> Model:
    if pattern is None:
        return model
    layers = tuple(dataclasses.replace(la, op=pattern) if la.kind == LayerKind.ATTENTION
                   else la for la in model.layers)
    return dataclasses.replace(model, layers=layers)


def simulate(model_or_file, arch: ArchSpec | str | Path | None = None, *, engine: str = "fast",
             dataflow: str | None = None, seed: int = 0, inputs=None,
             attention_pattern: str | None = None, progress: bool = False,
             **sizes) -> ModelResult:
    """Simulate every layer in order on `arch`; returns a `ModelResult` (cycles at the array
    clock, bytes, pJ). `sizes` (e.g. seq=8) fill a model file's size names;
    `attention_pattern` replaces every attention layer's pattern; `progress` shows a bar of
    the layers done on stderr (the CLI sets it on a terminal)."""

    if engine not in ENGINES:
        raise ModelError(f"engine must be one of {ENGINES}, got {engine!r}")
    bound = bind(model_or_file, inputs, seed, **sizes)
    model = _with_pattern(bound.model, attention_pattern)
    spec = resolve_arch(arch)
    runners = {la.name: runner_for(la) for la in model.layers}  # fail before any work
    options = RunOptions(engine=engine, dataflow=dataflow, seed=seed)
    env: dict[str, np.ndarray] = {MODEL_INPUT: np.asarray(bound.example_input)}
    own = {} if inputs is not None else _own_inputs(model, env[MODEL_INPUT],
                                                    np.random.default_rng(seed + 1))
    runs: dict[str, LayerRun] = {}
    for layer in tqdm(model.layers, desc=model.name, unit="layer", disable=not progress,
                      leave=False, dynamic_ncols=True):
        ins = [f.value({**env, MODEL_INPUT: own[layer.name]} if layer.name in own else env)
               for f in bound.feeds[layer.name]]
        run = runners[layer.name](layer, ins, bound.weights.get(layer.name, {}), spec, options)
        runs[layer.name] = run
        env[layer.name] = np.asarray(run.output)
    places, notes = handoffs(model, env, bound.weights, spec)
    adjusted = apply_handoffs(model, runs, env, places, spec)
    layers = tuple(LayerResult(la, adjusted[la.name], places[la.name],
                               values_match(runs[la.name].output, runs[la.name].reference))
                   for la in model.layers)
    output = bound.output.value(env)
    if bound.reference_output is not None:
        match = values_match(output, bound.reference_output)
        err = max_abs_error(output, bound.reference_output)
        notes = notes + ("values compared with the PyTorch model's own output",)
    else:
        match = all(lr.values_match_reference for lr in layers)
        err = max(max_abs_error(r.output, r.reference) for r in runs.values())
        notes = notes + ("values: every layer against its numpy reference on the same inputs",)
    if attention_pattern is not None:
        notes += (f"attention pattern {attention_pattern} on every attention layer",)
    if own:
        notes += (f"{len(own)} layer(s) read the model input in another shape and got seeded "
                  "inputs of their own (independent rows, as in a topology file)",)
    return ModelResult(model, spec.name, layers, output=output, values_match_reference=match,
                       max_abs_error=err, notes=tuple(bound.notes) + notes)


# --- between layers ---------------------------------------------------------------------------

def _weight_words(weights: dict[str, np.ndarray]) -> int:
    return sum(int(np.asarray(w).size) for k, w in weights.items() if k != "eps")


def working_set_words(layer: Layer, env, weights, excluding: str = "") -> int:
    """Words `layer` holds while it runs: its inputs (each once, `excluding` left out), its
    weights and its output."""
    ins = sum(int(env[i].size) for i in dict.fromkeys(layer.inputs) if i != excluding)
    return ins + _weight_words(weights.get(layer.name, {})) + int(env[layer.name].size)


def handoffs(model: Model, env, weights, arch: ArchSpec):
    """(layer name -> Activation, notes): where each output waits (module docstring rule)."""
    cap = arch.spm.capacity_words
    index = {la.name: i for i, la in enumerate(model.layers)}
    readers: dict[str, list[int]] = {la.name: [] for la in model.layers}
    for i, la in enumerate(model.layers):
        for src in dict.fromkeys(la.inputs):
            if src in readers:
                readers[src].append(i)
    places, notes = {}, []
    for la in model.layers:
        if not readers[la.name]:
            places[la.name] = Activation.OUTPUT
            continue
        words = int(env[la.name].size)
        span = model.layers[index[la.name] + 1:max(readers[la.name]) + 1]
        ws = max(working_set_words(j, env, weights, excluding=la.name) for j in span)
        fits = words + ws <= cap
        places[la.name] = Activation.SPM if fits else Activation.DRAM
        notes.append(f"{la.name} -> {places[la.name]}: {words:,} words + working set {ws:,} "
                     f"{'<=' if fits else '>'} {cap:,} SPM words")
    return places, tuple(notes)


def _less_dram(r: SimResult, read: int, written: int, arch: ArchSpec) -> SimResult:
    saved = read + written
    if not saved:
        return r
    bpc = arch.dram.bytes_per_cycle
    stall = min(r.stall_cycles_dram, math.ceil(saved / bpc))
    energy = tuple((k, v - saved * arch.energy.dram_byte_pj if k == "dram" else v)
                   for k, v in r.energy_pj)
    roof = (Roofline(r.roofline.compute_cycles, max(0.0, r.roofline.dram_cycles - saved / bpc),
                     r.roofline.spm_port_cycles) if r.roofline else None)
    return dataclasses.replace(
        r, dram_bytes_read=r.dram_bytes_read - read,
        dram_bytes_written=r.dram_bytes_written - written, stall_cycles_dram=r.stall_cycles_dram
        - stall, cycles=r.cycles - stall, energy_pj=energy, roofline=roof,
        notes=r.notes + (f"SPM hand-offs: {read:,} B read and {written:,} B written not sent "
                         f"to DRAM, {stall:,} DRAM stall cycles removed",))


def apply_handoffs(model: Model, runs: dict[str, LayerRun], env, places,
                   arch: ArchSpec) -> dict[str, SimResult]:
    """Each layer's result less the DRAM traffic of its SPM hand-offs (module docstring)."""
    read = {la.name: 0 for la in model.layers}
    written = dict(read)
    for la in model.layers:
        if places[la.name] != Activation.SPM:
            continue
        out_bytes = int(env[la.name].size) * arch.word_bytes
        written[la.name] += min(out_bytes, runs[la.name].result.dram_bytes_written)
        for j in model.layers:
            if la.name in j.inputs:
                left = runs[j.name].result.dram_bytes_read - read[j.name]
                read[j.name] += min(out_bytes, left)
    return {la.name: _less_dram(runs[la.name].result, read[la.name], written[la.name], arch)
            for la in model.layers}
