"""Builds notebooks/08_whole_models.ipynb (executed with `python scripts/run_notebooks.py 08` and
committed with its outputs; the test suite runs it again).

    python notebooks/make_08_whole_models.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("md", """# 08 · Whole models, layer by layer

`dataflow.models.simulate` runs a whole network on one architecture: every layer through the
engine (or, for the element-wise functions the frontend has no lowering for, the host cost model,
which each layer's notes say), each layer's values checked against numpy, and between layers the
SPM/DRAM hand-off rule. Here: one BERT-base encoder layer (`models/bert_base_layer.yaml`) at
small sizes so the notebook runs in seconds, with dense attention against two sparse patterns;
then the same model against a GPU, and SCALE-Sim parity on the convolutions of ResNet-18."""),
    ("code", """%matplotlib inline
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, display

import dataflow
from dataflow.cuda.compare import compare_model
from dataflow.models import simulate
from dataflow.report import load_result, save_result, write_report

BERT = Path("../models/bert_base_layer.yaml")
SIZES = {"seq": 64, "hidden": 64, "heads": 2, "ffn": 128}  # BERT-base: 512, 768, 12, 3072
PATTERNS = ("dense", "window", "bigbird")
runs = {p: simulate(BERT, arch="default", attention_pattern=p, **SIZES) for p in PATTERNS}
for p, r in runs.items():
    print(f"{p:>8}: {r.cycles:>8,} cycles, {r.energy_total_pj / 1e6:7.3f} uJ, "
          f"{r.dram_bytes:>9,} DRAM bytes, values match: {r.values_match_reference}")
assert all(r.values_match_reference for r in runs.values())"""),
    ("md", """Layer by layer: only the attention layer changes with the pattern; the projections,
the FFN and the element-wise layers cost the same in every run."""),
    ("code", """names = [lr.layer.name for lr in runs["dense"].layers]
print(f"{'layer':<6}" + "".join(f"{p:>10}" for p in PATTERNS))
for n in names:
    print(f"{n:<6}" + "".join(f"{runs[p].layer(n).result.cycles:>10,}" for p in PATTERNS))
for n in names:
    if n != "attn":
        assert len({runs[p].layer(n).result.cycles for p in PATTERNS}) == 1, n

fig, ax = plt.subplots(figsize=(8, 3.4), layout="constrained")
x = np.arange(len(names))
for i, p in enumerate(PATTERNS):
    ax.bar(x + (i - 1) * 0.27, [runs[p].layer(n).result.cycles for n in names], 0.27, label=p)
ax.set_xticks(x, names, rotation=45, fontsize=8)
ax.set_ylabel("cycles")
ax.set_title(f"BERT-base layer at seq {SIZES['seq']}: cycles per layer by attention pattern")
fig.legend(loc="outside right upper")
plt.show()"""),
    ("md", """The same pictures `dataflow simulate --model ... --save r.json` then `dataflow report
r.json --out DIR` draw: cycles per layer split into compute and each stall cause, a roofline with
one point per layer, and each layer's share of the time (here for the dense and the window
runs)."""),
    ("code", """folder = Path(tempfile.mkdtemp())
for p in ("dense", "window"):
    data = load_result(save_result(runs[p], folder / f"{p}.json"))
    written, skipped = write_report(data, folder / p)
    print(p, [w.name for w in written], skipped)
    display(Image(folder / p / "layer_cycles.png"))
display(Image(folder / "dense" / "layer_roofline.png"))
display(Image(folder / "window" / "layer_share.png"))"""),
    ("md", """Against a GPU, per layer. Without a GPU on this machine every GPU time is the
roofline of the layer's FLOPs and compulsory bytes (`dataflow.cuda.compare.layer_work`) and is
labelled *modelled*; on a machine with that GPU the GEMM and attention layers are measured with
the CUDA kernels and labelled *measured*."""),
    ("code", """cmp = compare_model(BERT, gpus=["jetson_xavier_nx", "a100"],
                    measure_if_present=False, result=runs["window"])
print(cmp.summary())
assert all(g.time_source == "modelled" for x in cmp.layers for g in x.gpus)"""),
    ("md", """## SCALE-Sim parity on a conv net

ResNet-18's convolutions as im2col GEMMs in SCALE-Sim's convention (M = output pixels
Ho x Wo, K = R x S x C, N = filters; He et al. 2016, Table 1, 224 x 224 input), on the
`systolic_32x32` preset, against the closed form of SCALE-Sim 3.0.0's compute cycles
(`benchmarks/scalesim/closed_form.py`, checked against SCALE-Sim's own output in
`tests/test_scalesim_closed_form.py`). The shapes are written out here; once
`dataflow.models.topology` lands, this section reads them from a SCALE-Sim topology file
instead."""),
    ("code", """from benchmarks.scalesim.closed_form import scalesim_compute_cycles

# (layer, Ho*Wo, R*S*C, filters): one row per distinct convolution of ResNet-18, and the FC layer
RESNET18 = [("conv1", 112 * 112, 7 * 7 * 3, 64), ("s1_conv3x3", 56 * 56, 3 * 3 * 64, 64),
            ("s2_conv3x3_s2", 28 * 28, 3 * 3 * 64, 128), ("s2_proj", 28 * 28, 64, 128),
            ("s2_conv3x3", 28 * 28, 3 * 3 * 128, 128), ("s3_conv3x3_s2", 14 * 14, 3 * 3 * 128, 256),
            ("s3_proj", 14 * 14, 128, 256), ("s3_conv3x3", 14 * 14, 3 * 3 * 256, 256),
            ("s4_conv3x3_s2", 7 * 7, 3 * 3 * 256, 512), ("s4_proj", 7 * 7, 256, 512),
            ("s4_conv3x3", 7 * 7, 3 * 3 * 512, 512), ("fc", 1, 512, 1000)]
print(f"{'layer':<15}{'M':>7}{'K':>6}{'N':>6}  df {'dataflow':>9} {'SCALE-Sim':>10}")
for name, m, k, n in RESNET18:
    for df in ("os", "ws"):
        r = dataflow.simulate("gemm", arch="systolic_32x32", m=m, k=k, n=n, dataflow=df)
        ref = scalesim_compute_cycles(m, n, k, df)
        print(f"{name:<15}{m:>7}{k:>6}{n:>6}  {df} {r.compute_cycles:>9,} {ref:>10,}")
        assert r.compute_cycles == ref, (name, df)
print("every layer: the systolic engine's compute cycles equal SCALE-Sim's closed form")"""),
]


def main() -> None:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src)
                             for kind, src in CELLS])
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python",
                                  "name": "python3"}, "language_info": {"name": "python"}}
    path = Path(__file__).resolve().parent / "08_whole_models.ipynb"
    nbformat.write(nb, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
