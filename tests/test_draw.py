"""``Tensor.draw()``: a matplotlib Figure of the sparsity pattern, the levels and their storage.

draw() never touches pyplot (it builds a ``matplotlib.figure.Figure`` directly), so no backend
needs selecting here.
"""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from dataflow.ust_frontend import NamedFormats, Tensor
from dataflow.ust_frontend.draw import draw

# The 4x8 example of docs/references.md#universal-sparse-tensor.
EXAMPLE_ENTRIES = [(0, 0), (0, 1), (1, 1), (1, 3), (2, 2), (3, 3)]


def example_matrix() -> np.ndarray:
    a = np.zeros((4, 8))
    for n, (i, j) in enumerate(EXAMPLE_ENTRIES):
        a[i, j] = n + 1
    return a


FORMATS = {
    "CSR": NamedFormats.CSR,
    "CSC": NamedFormats.CSC,
    "COO": NamedFormats.COO,
    "DIA": NamedFormats.DIAJ,
    "BSR2x2": NamedFormats.BSR(2, 2),
    "ELL": NamedFormats.ELL,
    "2:4": NamedFormats.NM(2, 4),
    "DELTA4": NamedFormats.DELTA(4),
    "dense": NamedFormats.DenseMatrixRight,
}


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", list(FORMATS))
def test_draw_matrix_formats(name, tmp_path):
    tensor = Tensor.from_dense(example_matrix(), FORMATS[name])
    fig = tensor.draw()
    assert isinstance(fig, Figure)
    texts = _texts(fig)
    # one header per level, naming its expression and type
    for k, spec in enumerate(tensor.tensor_format.levels):
        assert any(t.startswith(f"level {k}:") and str(spec.type) in t for t in texts), texts
    assert any(t.startswith(f"val[{tensor.nse}]") for t in texts)
    out = tmp_path / f"{name.replace(':', '_')}.png"
    fig.savefig(out, dpi=80)
    assert out.stat().st_size > 1000 and _is_png(out)


def test_draw_shows_storage_arrays():
    tensor = Tensor.from_dense(example_matrix(), NamedFormats.CSR)
    texts = _texts(tensor.draw())
    assert "pos(1)[5]" in texts and "crd(1)[6]" in texts
    # the CSR arrays of docs/references.md#universal-sparse-tensor appear box by box
    boxes = [t for t in texts if t.isdigit()]
    for value in ("0", "2", "4", "5", "6", "1", "3"):
        assert value in boxes


def test_draw_sparse_vector(tmp_path):
    x = np.array([0.0, 1.5, 0.0, 0.0, 2.0, 0.0, 0.0, 3.25])
    tensor = Tensor.from_dense(x, NamedFormats.SparseVector)
    fig = draw(tensor)
    assert isinstance(fig, Figure)
    assert "crd(0)[3]" in _texts(fig)
    fig.savefig(tmp_path / "vector.png")
    assert _is_png(tmp_path / "vector.png")


def test_draw_truncates_long_arrays(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.random((60, 80)) * (rng.random((60, 80)) < 0.05)
    tensor = Tensor.from_dense(a, NamedFormats.CSR)
    fig = tensor.draw(max_items=12)
    texts = _texts(fig)
    assert "\u2026" in texts
    # every array row holds at most max_items boxes (the ellipsis included)
    assert len([t for t in texts if t == "\u2026"]) == 3  # pos, crd, val
    fig.savefig(tmp_path / "big.png", dpi=60)
    assert _is_png(tmp_path / "big.png")


def test_draw_into_given_axes_and_other_ranks(tmp_path):
    from matplotlib.figure import Figure as F

    fig = F(figsize=(8, 4))
    ax = fig.add_subplot()
    tensor = Tensor.from_dense(example_matrix(), NamedFormats.COO)
    assert draw(tensor, ax=ax) is fig
    batched = Tensor.from_dense(np.arange(24.0).reshape(2, 3, 4) % 3,
                                NamedFormats.BatchedCSR)
    scalar = Tensor.from_dense(np.array(3.0), NamedFormats.Scalar)
    empty = Tensor.from_dense(np.zeros((3, 3)), NamedFormats.CSR)
    for t in (batched, scalar, empty):
        t.draw().savefig(tmp_path / "x.png", dpi=50)
    with pytest.raises(ValueError, match="max_items"):
        draw(tensor, max_items=2)
