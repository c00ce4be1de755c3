"""``draw(tensor)``: a matplotlib picture of a UST ``Tensor``'s sparsity pattern and storage.

Top: the sparsity pattern (2-D tensors as a grid, 1-D tensors as a strip) with every stored
position shaded: dark where the stored value is nonzero, light where the format stores a filler
zero (DIA diagonals, BSR blocks, N:M groups, ELL padding). Below: one row per level with its
level expression, level type and size, then the contents of its ``pos`` and ``crd`` arrays as
boxes, and finally the ``val`` array. Long arrays are truncated with an ellipsis box.

Everything is drawn into one ``Axes`` in "box units" (one array box is 1 x 1), so the picture can
go into an ``ax`` of the caller's figure. Without ``ax`` a new ``matplotlib.figure.Figure`` is
made directly (no pyplot, so no global figure state and no GUI backend is ever touched).
"""

from __future__ import annotations

import numpy as np

from dataflow.errors import UserError

from .storage import Storage, walk

# Deferred imports: matplotlib is imported where a picture is drawn (start-up).

#: Box colours: pos, crd and val arrays; the pattern's nonzero and filler cells.
_COLORS = {
    "pos": "#fdd9a0",
    "crd": "#b9d7f0",
    "val": "#c7e9c0",
    "ellipsis": "#eeeeee",
    "nonzero": "#2b6cb0",
    "filler": "#bcd3ea",
    "empty": "#ffffff",
}
_LABEL_WIDTH = 4.0    # box units left of the arrays / the matrix, for labels
_INCH_PER_UNIT = 0.32  # figure scale when draw() makes the figure
_MAX_PATTERN_SIDE = 14.0  # the pattern's longest side, in box units
_ANNOTATE_CELLS = 16  # annotate pattern cells with values when both sides are at most this


def draw(tensor, ax=None, *, max_items: int = 24, title: str | None = None):
    """A matplotlib ``Figure`` picturing ``tensor``: its sparsity pattern, levels and storage.

    Args:
        tensor: a ``dataflow.ust_frontend.Tensor``.
        ax: a matplotlib ``Axes`` to draw into; by default a new figure sized to the picture.
        max_items: arrays longer than this are shown as their head, an ellipsis and their tail.
        title: the picture's title; by default the format's name and string, shape and nse.

    Returns:
        The ``Figure`` holding the picture (``ax.figure`` when ``ax`` is given).
    """
    if max_items < 4:
        raise UserError(f"max_items must be at least 4, got {max_items}")
    fmt = tensor.tensor_format
    shape = tuple(tensor.shape)
    nlev = fmt.num_levels
    sizes = fmt.level_sizes(shape) if nlev else ()
    pos = [tensor.pos(k) for k in range(nlev)]
    crd = [tensor.crd(k) for k in range(nlev)]
    val = np.asarray(tensor.val)

    # -- layout (y grows downwards; one array box is 1 x 1) ------------------------------------
    arrays = [a for a in pos + crd + [val] if a is not None]
    widest = max([min(a.size, max_items) for a in arrays] + [1])
    pattern = _pattern_geometry(shape, widest)
    if title is None:
        name = f"{fmt.name}: " if fmt.name else ""
        dims = "x".join(map(str, shape)) or "scalar"
        title = f"{name}{fmt}\n{dims} {tensor.dtype}, nse {tensor.nse}"

    title_lines = title.splitlines() or [""]
    y = 0.45 * len(title_lines) + 0.4
    pattern_top = None
    if pattern is not None:
        pattern_top = y + 0.6  # room for column labels
        y = pattern_top + pattern["height"] + 0.8
    rows = []  # (kind, y, payload)
    for k in range(nlev):
        rows.append(("level", y, k))
        y += 1.0
        for label, array in (("pos", pos[k]), ("crd", crd[k])):
            if array is not None:
                rows.append((label, y, (k, array)))
                y += 1.35
        y += 0.2
    rows.append(("val", y, val))
    y += 1.35
    total_h = y
    total_w = _LABEL_WIDTH + max(widest, pattern["width"] + 2.0 if pattern else 0, 12)
    # a 9-point monospace character is about 0.235 box units wide at this scale
    total_w = max(total_w, 0.235 * max(len(line) for line in title_lines))

    # -- figure ----------------------------------------------------------------------------------
    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=((total_w + 0.4) * _INCH_PER_UNIT,
                              (total_h + 0.4) * _INCH_PER_UNIT))
        ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    fig = ax.figure
    ax.set_xlim(-0.2, total_w + 0.2)
    ax.set_ylim(total_h + 0.2, -0.2)
    ax.set_aspect("equal", adjustable="box")
    ax.set_axis_off()
    ax.text(0.0, 0.1, title, fontsize=9, ha="left", va="top", family="monospace")

    if pattern is not None:
        _draw_pattern(ax, tensor, pattern, pattern_top)
    for kind, row_y, payload in rows:
        if kind == "level":
            k = payload
            spec = fmt.levels[k]
            stored = [lab for lab, a in (("pos", pos[k]), ("crd", crd[k])) if a is not None]
            note = "" if stored else "   (stores nothing)"
            ax.text(0.0, row_y + 0.5, f"level {k}:  {spec.expr} : {spec.type}", fontsize=8,
                    va="center", ha="left", family="monospace", weight="bold")
            ax.text(total_w, row_y + 0.5, f"size {sizes[k]}{note}", fontsize=7, va="center",
                    ha="right", family="monospace", color="#555555")
        elif kind in ("pos", "crd"):
            k, array = payload
            _draw_array(ax, row_y, f"{kind}({k})", np.asarray(array), _COLORS[kind], max_items)
        else:
            _draw_array(ax, row_y, "val", payload, _COLORS["val"], max_items)
    return fig


# -- pieces ----------------------------------------------------------------------------------


def _pattern_geometry(shape: tuple[int, ...], widest: int):
    """Cell size and extent of the pattern panel (None for tensors of rank 0 or above 2)."""
    if len(shape) == 1:
        rows, cols = 1, shape[0]
    elif len(shape) == 2:
        rows, cols = shape
    else:
        return None
    if rows == 0 or cols == 0:
        return None
    side = max(float(_MAX_PATTERN_SIDE), min(float(widest), 24.0))
    cell = min(1.0, side / cols, _MAX_PATTERN_SIDE / rows)
    return {"rows": rows, "cols": cols, "cell": cell, "width": cols * cell,
            "height": rows * cell}


def _stored_positions(tensor):
    """Dimension coordinates and values of every stored position inside the shape."""
    fmt = tensor.tensor_format
    storage = Storage(tuple(tensor.pos(k) for k in range(fmt.num_levels)),
                      tuple(tensor.crd(k) for k in range(fmt.num_levels)),
                      np.asarray(tensor.val))
    lvl, positions = walk(fmt, tensor.shape, storage)
    values = np.asarray(tensor.val)[positions]
    dims = [np.asarray(d, np.int64) for d in fmt.lvl2dim(lvl)]
    inside = np.ones(len(positions), bool)
    for d, n in zip(dims, tensor.shape):
        inside &= (d >= 0) & (d < n)
    return [d[inside] for d in dims], values[inside]


def _draw_pattern(ax, tensor, geo, top: float):
    from matplotlib.colors import to_rgba

    rows, cols, cell = geo["rows"], geo["cols"], geo["cell"]
    dims, values = _stored_positions(tensor)
    if len(tensor.shape) == 1:
        r, c = np.zeros_like(dims[0]), dims[0]
    else:
        r, c = dims
    # 0 = empty, 1 = stored filler zero, 2 = stored nonzero (nonzero wins over duplicates)
    state = np.zeros((rows, cols), np.int8)
    np.maximum.at(state, (r, c), np.where(values != 0, 2, 1).astype(np.int8))
    palette = np.array([to_rgba(_COLORS[k]) for k in ("empty", "filler", "nonzero")])
    x0 = _LABEL_WIDTH
    ax.imshow(palette[state], extent=(x0, x0 + cols * cell, top + rows * cell, top),
              interpolation="nearest", origin="upper", zorder=1)
    ax.add_patch(_rect(x0, top, cols * cell, rows * cell, fill=False, lw=0.8))
    small = rows <= _ANNOTATE_CELLS and cols <= 2 * _ANNOTATE_CELLS
    if small:  # cell grid
        for i in range(1, rows):
            ax.plot([x0, x0 + cols * cell], [top + i * cell] * 2, color="#cccccc", lw=0.4,
                    zorder=2)
        for j in range(1, cols):
            ax.plot([x0 + j * cell] * 2, [top, top + rows * cell], color="#cccccc", lw=0.4,
                    zorder=2)
    if small and cols <= _ANNOTATE_CELLS:  # the values, in the cells that store one
        dense = {}
        for ri, ci, v in zip(r.tolist(), c.tolist(), values.tolist()):
            dense[(ri, ci)] = dense.get((ri, ci), 0) + v
        for (ri, ci), v in dense.items():
            text = _fmt_value(v)
            ax.text(x0 + (ci + 0.5) * cell, top + (ri + 0.5) * cell, text,
                    fontsize=_fontsize(text, 7 * cell), ha="center", va="center", zorder=3,
                    color="white" if v != 0 else "#333333")
    # axis labels: dimension names and a few coordinates
    names = tensor.tensor_format.dims
    step_c = max(1, int(np.ceil(cols / 16)))
    for j in range(0, cols, step_c):
        ax.text(x0 + (j + 0.5) * cell, top - 0.15, str(j), fontsize=6, ha="center", va="bottom",
                color="#555555")
    col_name = names[-1] if names else ""
    ax.text(x0 + cols * cell + 0.3, top - 0.15, f"{col_name} \u2192", fontsize=7, ha="left",
            va="bottom", style="italic")
    if len(tensor.shape) == 2:
        step_r = max(1, int(np.ceil(rows / 16)))
        for i in range(0, rows, step_r):
            ax.text(x0 - 0.15, top + (i + 0.5) * cell, str(i), fontsize=6, ha="right",
                    va="center", color="#555555")
        ax.text(x0 - 1.0, top + rows * cell / 2, f"{names[0]} \u2193", fontsize=7, ha="right",
                va="center", style="italic")
    legend_y = top + rows * cell + 0.45
    ax.add_patch(_rect(x0, legend_y - 0.2, 0.4, 0.4, color=_COLORS["nonzero"]))
    ax.text(x0 + 0.55, legend_y, "stored nonzero", fontsize=6, va="center")
    if (values == 0).any():
        ax.add_patch(_rect(x0 + 5.0, legend_y - 0.2, 0.4, 0.4, color=_COLORS["filler"]))
        ax.text(x0 + 5.55, legend_y, "stored zero (filler)", fontsize=6, va="center")


def _draw_array(ax, y: float, label: str, array: np.ndarray, color: str, max_items: int):
    """One array as a row of boxes starting at the label column; long ones get an ellipsis."""
    n = int(array.size)
    ax.text(_LABEL_WIDTH - 0.2, y + 0.5, f"{label}[{n}]", fontsize=7, ha="right", va="center",
            family="monospace")
    if n == 0:
        ax.text(_LABEL_WIDTH, y + 0.5, "(empty)", fontsize=7, va="center", color="#777777")
        return
    if n <= max_items:
        cells = [(k, array[k]) for k in range(n)]
    else:
        tail = 2
        head = max_items - 1 - tail
        cells = [(k, array[k]) for k in range(head)] + [(None, None)]
        cells += [(k, array[k]) for k in range(n - tail, n)]
    for slot, (k, v) in enumerate(cells):
        x = _LABEL_WIDTH + slot
        if k is None:
            ax.add_patch(_rect(x, y, 1.0, 1.0, color=_COLORS["ellipsis"], lw=0.5))
            ax.text(x + 0.5, y + 0.5, "\u2026", fontsize=8, ha="center", va="center")
            continue
        ax.add_patch(_rect(x, y, 1.0, 1.0, color=color, lw=0.5))
        text = _fmt_value(v)
        ax.text(x + 0.5, y + 0.5, text, fontsize=_fontsize(text, 7), ha="center", va="center")
        if slot == 0 or k % 5 == 0 or k == n - 1:  # a few indices under the boxes
            ax.text(x + 0.5, y + 1.02, str(k), fontsize=5.5, ha="center", va="top",
                    color="#888888")


def _rect(x, y, w, h, *, color=None, fill=True, lw=0.5):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, facecolor=color if fill else "none", edgecolor="#444444",
                     lw=lw, zorder=2)


def _fmt_value(v) -> str:
    v = np.asarray(v).item()
    if isinstance(v, (bool, np.bool_)):
        return "T" if v else "F"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, complex):
        return f"{v.real:.2g}{v.imag:+.2g}j"
    if float(v).is_integer() and abs(v) < 1e5:
        return str(int(v))
    text = f"{v:.3g}"
    return text if len(text) <= 4 else f"{v:.2g}"


def _fontsize(text: str, base: float) -> float:
    """Shrink long labels so they stay inside their box."""
    return max(4.0, base * min(1.0, 4.0 / max(len(text), 1)))


__all__ = ["draw"]
