"""Pictures of a simulation: Gantt chart of the modulo schedule, PE utilisation heatmap, SPM
line heatmap, roofline. Each takes the plain data of a result file (`result_file.result_data`)
and a path, draws with matplotlib's Agg backend and returns the path. A model result
(`result_file.model_result_data`) gets its own three (cycles per layer split into compute and
stall causes, a roofline with one point per layer, each layer's share of the time) and the PE
and SPM heatmaps of the layers summed.

Every figure uses matplotlib's constrained layout, and a legend that would cover data sits
outside the axes (`fig.legend(loc="outside ...")`), so nothing is drawn over the data or past
the figure's edge at its saved size (`tests/test_report.py` checks every artist's extent)."""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import numpy as np

from dataflow.errors import UserError
from dataflow.report.result_file import MODEL_FORMAT

OP_COLOURS = {"load": "#4c72b0", "gather": "#64b5cd", "store": "#dd8452", "scatter": "#ffb482",
              "acc": "#c44e52", "accmax": "#c44e52", "mul": "#55a868", "mac": "#2ca02c",
              "add": "#8172b3", "sub": "#8172b3", "max": "#937860", "exp": "#da8bc3",
              "div": "#da8bc3", "bfly": "#ccb974", "route": "#8c8c8c", "const": "#bbbbbb"}


@functools.cache
def _pyplot():
    """matplotlib.pyplot on the Agg backend. Imported on the first picture, not with the
    package: it costs most of a second, and `dataflow simulate` draws nothing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gantt(data: dict, path, kernel: str | None = None, iterations: int = 3) -> Path:
    """Ops of one kernel on their PEs over time: `iterations` consecutive waves (wave w starts
    w x II later), one row per PE used, bars labelled copy.node."""
    plt = _pyplot()
    rows = data["schedule"]
    if not rows:
        raise UserError("the result holds no schedule (a systolic mapping, a workload whose "
                         "own simulator records none, or a bare --json file)")
    kernel = kernel or rows[0]["kernel"]
    rows = [r for r in rows if r["kernel"] == kernel]
    ii = rows[0]["ii"]
    pes = sorted({(r["pe_row"], r["pe_col"]) for r in rows})
    y = {pe: i for i, pe in enumerate(pes)}
    # a multi-issue PE (docs/architecture.md#issue-width) issues several ops in one slot: they
    # share the PE's row, one thin bar each, in (copy, node) order
    slot_ops: dict = {}
    for r in sorted(rows, key=lambda r: (r["copy"], r["node"])):
        slot_ops.setdefault((r["pe_row"], r["pe_col"], r["time"] % ii), []).append(id(r))
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.28 * len(pes) + 1)), layout="constrained")
    for w in range(iterations):
        for r in rows:
            start = r["time"] + w * ii
            mates = slot_ops[(r["pe_row"], r["pe_col"], r["time"] % ii)]
            h = 0.8 / len(mates)
            at = y[(r["pe_row"], r["pe_col"])] - 0.4 + h * (mates.index(id(r)) + 0.5)
            ax.barh(at, r["latency"], left=start, height=h,
                    color=OP_COLOURS.get(r["op"], "#999999"), alpha=1.0 if w == 0 else 0.45,
                    edgecolor="black", linewidth=0.3)
            if w == 0:
                ax.text(start + 0.05, at, f"{r['copy']}.{r['node']}", va="center",
                        fontsize=6 if len(mates) == 1 else 4)
    ax.set_yticks(range(len(pes)), [f"PE{pe}" for pe in pes], fontsize=6)
    ax.set_xlabel("cycle (iteration 0 opaque, later waves every II cycles faded)")
    ax.set_title(f"{kernel}: modulo schedule, II = {ii}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=OP_COLOURS.get(o, "#999")) for o in
               sorted({r['op'] for r in rows})]
    # beside the axes: inside, it would cover the bars of the top PEs' late ops
    fig.legend(handles, sorted({r["op"] for r in rows}), fontsize=6, loc="outside right upper")
    ax.invert_yaxis()
    return _save(fig, path)


def pe_heatmap(data: dict, path) -> Path:
    plt = _pyplot()
    busy = np.asarray(data["arrays"].get("pe_busy_cycles", []), dtype=float)
    if busy.size == 0:
        raise UserError("the result holds no per-PE busy cycles (save it with --save)")
    # ops over PE issue capacity (docs/architecture.md#issue-width): in [0, 1] at any width
    cycles = max(1, data["result"]["cycles"]) * data["result"].get("issue_width", 1)
    fig, ax = plt.subplots(figsize=(4.5, 4), layout="constrained")
    im = ax.imshow(busy / cycles, cmap="viridis", vmin=0, vmax=1)
    for (r, c), v in np.ndenumerate(busy / cycles):  # dark digits on viridis' light end
        ax.text(c, r, f"{100 * v:.0f}", ha="center", va="center", fontsize=6,
                color="black" if v > 0.6 else "white")
    fig.colorbar(im, ax=ax, label="ops issued over issue capacity (cycles x issue width)")
    ax.set_title(f"PE utilisation ({100 * data['result'].get('pe_utilization', 0):.1f}% overall)")
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    return _save(fig, path)


def spm_heatmap(data: dict, path) -> Path:
    plt = _pyplot()
    arr, res = data["arrays"], data["result"]
    reads = arr.get("spm_reads_per_line", res.get("spm_reads_per_line"))
    writes = arr.get("spm_writes_per_line", res.get("spm_writes_per_line"))
    if reads is None:
        raise UserError("the result holds no per-line SPM counts")
    m = [reads, writes]
    labels = ["row reads", "row writes"]
    if "spm_conflicts_per_line" in arr:
        m.append(arr["spm_conflicts_per_line"])
        labels.append("conflict cycles")
    m = np.asarray(m, dtype=float)
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * m.shape[1] + 2), 2.6), layout="constrained")
    share = m / np.maximum(m.max(axis=1, keepdims=True), 1)
    im = ax.imshow(share, cmap="magma", aspect="auto")
    lightest = share.min() + 0.6 * (share.max() - share.min())  # where magma turns light
    for (r, c), v in np.ndenumerate(m):
        ax.text(c, r, f"{int(v)}", ha="center", va="center", fontsize=5,
                color="black" if share[r, c] > lightest else "white")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("SPM line")
    ax.set_title("SPM traffic per line (colour: share of the busiest line)")
    fig.colorbar(im, ax=ax)
    return _save(fig, path)


def roofline(data: dict, path) -> Path:
    """MACs per cycle against MACs per DRAM byte, under the compute and bandwidth roofs."""
    plt = _pyplot()
    res = data["result"]
    roof = data.get("roofline") or {}
    peak = roof.get("peak_macs_per_cycle")
    bw = roof.get("dram_bytes_per_cycle")
    if not peak or not bw:
        raise UserError("the result holds no roofline peaks (save it with --save)")
    intensity = res["macs"] / max(1, res["dram_bytes"])
    achieved = res["macs"] / max(1, res["cycles"])
    x = np.logspace(-3, 4, 200)
    fig, ax = plt.subplots(figsize=(5, 4.4), layout="constrained")
    ax.loglog(x, np.minimum(peak, bw * x), "k-",
              label=f"roof: min({peak} MAC/cyc, {bw:g} B/cyc x I)")
    ax.loglog([intensity], [achieved], "o", color="#c44e52",
              label=textwrap.fill(f"{res['workload']}: {achieved:.3g} MAC/cyc "
                                  f"({100 * achieved / min(peak, bw * intensity):.0f}% of roof)",
                                  80))
    ax.axvline(peak / bw, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("operational intensity (MACs per DRAM byte)")
    ax.set_ylabel("MACs per cycle")
    ax.set_title(f"roofline: {res['arch']}")
    # below the axes: a workload's name (bigbird's parameters) is wider than the plot
    fig.legend(fontsize=6, loc="outside lower center")
    return _save(fig, path)


def _save(fig, path) -> Path:
    plt = _pyplot()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# --- a model, layer by layer ------------------------------------------------------------------

CAUSE_COLOURS = {"compute": "#55a868", "spm_conflict": "#c44e52", "dram_bandwidth": "#4c72b0",
                 "reconfiguration": "#ccb974", "dependency": "#8172b3"}
KIND_COLOURS = {"gemm": "#4c72b0", "conv2d": "#dd8452", "attention": "#c44e52",
                "elementwise": "#8c8c8c", "embedding": "#937860", "moe": "#8172b3"}


def _layers(data: dict) -> list[dict]:
    return data["model"]["layers"]


def _layer_axes(plt, n: int, width: float = 8.0):
    """One horizontal bar per layer, first layer on top."""
    fig, ax = plt.subplots(figsize=(width, max(2.6, 0.24 * n + 1.4)), layout="constrained")
    ax.invert_yaxis()
    return fig, ax


def layer_cycles(data: dict, path) -> Path:
    """Cycles per layer, stacked: compute cycles, then each stall cause."""
    plt = _pyplot()
    layers = _layers(data)
    causes = list(dict.fromkeys(c for la in layers for c in la["stall_cycles"]))
    fig, ax = _layer_axes(plt, len(layers))
    y = np.arange(len(layers))
    left = np.zeros(len(layers))
    for part in ("compute", *causes):
        # compute cycles include the SPM-conflict stalls, drawn as their own segment
        vals = np.array([la["compute_cycles"] - la["stall_cycles"].get("spm_conflict", 0)
                         if part == "compute" else la["stall_cycles"].get(part, 0)
                         for la in layers], dtype=float)
        if part != "compute" and not vals.any():
            continue
        ax.barh(y, vals, left=left, height=0.75, color=CAUSE_COLOURS.get(part, "#bbbbbb"),
                label=part.replace("_", " ") + ("" if part == "compute" else " stall"))
        left += vals
    ax.set_yticks(y, [f"{la['name']} ({la['kind']})" for la in layers], fontsize=7)
    ax.set_xlabel("cycles")
    m = data["model"]
    ax.set_title(f"{m['model']} on {m['arch']}: {m['cycles']:,} cycles in {len(layers)} layers",
                 fontsize=9)
    # beside the axes: inside, it would cover the longest bars
    fig.legend(fontsize=7, loc="outside right upper")
    return _save(fig, path)


def layer_share(data: dict, path) -> Path:
    """Each layer's share of the model's cycles, coloured by kind."""
    plt = _pyplot()
    layers = _layers(data)
    total = max(1, data["model"]["cycles"])
    share = np.array([100 * la["cycles"] / total for la in layers])
    fig, ax = _layer_axes(plt, len(layers), width=7.0)
    y = np.arange(len(layers))
    ax.barh(y, share, height=0.75, color=[KIND_COLOURS.get(la["kind"], "#bbbbbb")
                                          for la in layers])
    for i, v in enumerate(share):
        ax.text(v, i, f" {v:.1f}%", va="center", fontsize=6)
    ax.set_xlim(0, max(share.max() * 1.18, 1))  # room for the labels after the bars
    ax.set_yticks(y, [la["name"] for la in layers], fontsize=7)
    ax.set_xlabel("share of the model's cycles (%)")
    ax.set_title(f"{data['model']['model']}: where the time goes", fontsize=9)
    kinds = list(dict.fromkeys(la["kind"] for la in layers))
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLOURS.get(k, "#bbbbbb")) for k in kinds]
    fig.legend(handles, kinds, fontsize=7, loc="outside right upper")
    return _save(fig, path)


def layer_roofline(data: dict, path) -> Path:
    """One point per layer with MACs: MACs per cycle against MACs per DRAM byte, under the
    array's compute and bandwidth roofs."""
    plt = _pyplot()
    roof = data.get("roofline") or {}
    peak, bw = roof.get("peak_macs_per_cycle"), roof.get("dram_bytes_per_cycle")
    if not peak or not bw:
        raise UserError("the result holds no roofline peaks (save it with --save)")
    layers = _layers(data)
    with_macs = [la for la in layers if la["macs"] > 0 and la["cycles"] > 0]
    if not with_macs:
        raise UserError("no layer of the model does MACs: nothing to place on a roofline")
    xs = np.array([la["macs"] / max(1, la["dram_bytes"]) for la in with_macs])
    ys = np.array([la["macs"] / la["cycles"] for la in with_macs])
    lo = min(xs.min(), peak / bw) / 10
    hi = max(xs.max(), peak / bw) * 10
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig, ax = plt.subplots(figsize=(6.5, 4.6), layout="constrained")
    ax.loglog(x, np.minimum(peak, bw * x), "k-",
              label=f"roof: min({peak} MAC/cyc, {bw:g} B/cyc x I)")
    for kind in dict.fromkeys(la["kind"] for la in with_macs):
        sel = [i for i, la in enumerate(with_macs) if la["kind"] == kind]
        ax.loglog(xs[sel], ys[sel], "o", color=KIND_COLOURS.get(kind, "#bbbbbb"), label=kind)
    if len(with_macs) <= 16:  # names beside the points; more would pile on each other
        for la, xv, yv in zip(with_macs, xs, ys):
            ax.annotate(la["name"], (xv, yv), textcoords="offset points", xytext=(4, 3),
                        fontsize=6)
    ax.axvline(peak / bw, color="grey", ls=":", lw=0.8)
    ax.set_ylim(top=peak * 3)
    ax.set_xlabel("operational intensity (MACs per DRAM byte)")
    ax.set_ylabel("MACs per cycle")
    left_out = len(layers) - len(with_macs)
    ax.set_title(f"roofline per layer: {data['model']['model']} on {data['model']['arch']}"
                 + (f"\n({left_out} layers without MACs not shown)" if left_out else ""),
                 fontsize=9)
    fig.legend(fontsize=7, loc="outside right upper")
    return _save(fig, path)


def _summed(data: dict) -> dict:
    """A model result as the single-run heatmaps read it: the layers' counts summed over the
    model's cycles."""
    m = data["model"]
    busy = np.asarray(data["arrays"].get("pe_busy_cycles", []), dtype=float)
    width = data.get("roofline", {}).get("issue_width", 1)
    util = (float(busy.sum()) / (busy.size * width * m["cycles"]) if busy.size and m["cycles"]
            else 0.0)
    return {"result": {"cycles": m["cycles"], "pe_utilization": util, "issue_width": width},
            "arrays": data["arrays"]}


PICTURES = (("gantt.png", gantt), ("pe_utilisation.png", pe_heatmap),
            ("spm_lines.png", spm_heatmap), ("roofline.png", roofline))
MODEL_PICTURES = (("layer_cycles.png", layer_cycles), ("layer_share.png", layer_share),
                  ("layer_roofline.png", layer_roofline),
                  ("pe_utilisation.png", lambda d, p: pe_heatmap(_summed(d), p)),
                  ("spm_lines.png", lambda d, p: spm_heatmap(_summed(d), p)))


def write_report(data: dict, out_dir) -> tuple[list[Path], list[str]]:
    """Every picture the data allows into `out_dir`; returns (written, skipped-with-reason)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file; name a folder for the pictures")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"--out {out}: cannot make the folder (a file stands in its "
                        "path)") from None
    written, skipped = [], []
    for name, fn in MODEL_PICTURES if data.get("format") == MODEL_FORMAT else PICTURES:
        try:
            written.append(fn(data, out / name))
        except ValueError as exc:
            skipped.append(f"{name}: {exc}")
    return written, skipped
