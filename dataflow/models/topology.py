"""SCALE-Sim topology files, read as they are (docs/references.md#scale-sim).

Two formats, told apart by the header line:

* convolution rows ``Layer, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels,
  Num Filter, Strides,`` -> `LayerKind.CONV2D` with sizes h, w, r, s, c, k, stride and
  ``op="scalesim"`` (SCALE-Sim's own output sizing, see `dataflow.models.conv`);
* GEMM rows ``Layer, M, N, K,`` -> `LayerKind.GEMM` with sizes m, k, n (ifmap m x k, filter
  k x n, as SCALE-Sim's ``topology_utils.load_arrays_gemm``).

Every row ends with a comma: SCALE-Sim reads ``row.split(',')[:-1]``, so a row without one
would lose its last value there; here it is an error. SCALE-Sim's optional sparsity column
(``N:M``) is accepted only as ``1:1`` (dense). The ifmap sizes of a conv row already include
any padding, as in SCALE-Sim's own files. Rows are independent layers: each reads its own
ifmap (the model's input), as SCALE-Sim runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dataflow.models.layers import MODEL_INPUT, Layer, LayerKind, Model, ModelError

#: SCALE-Sim's conv output sizing, recorded in `Layer.op` (dataflow.models.conv)
SCALESIM_SIZING = "scalesim"

CONV_COLUMNS = ("Layer", "IFMAP Height", "IFMAP Width", "Filter Height", "Filter Width",
                "Channels", "Num Filter", "Strides")
CONV_SIZES = ("h", "w", "r", "s", "c", "k", "stride")
GEMM_COLUMNS = ("Layer", "M", "N", "K")
GEMM_SIZES = ("m", "n", "k")


@dataclass(frozen=True)
class _Format:
    kind: LayerKind
    columns: tuple[str, ...]
    sizes: tuple[str, ...]


CONV = _Format(LayerKind.CONV2D, CONV_COLUMNS, CONV_SIZES)
GEMM = _Format(LayerKind.GEMM, GEMM_COLUMNS, GEMM_SIZES)


@dataclass(frozen=True)
class _Field:
    text: str
    column: int  # 1-based character column of the field's first character


def _split(line: str) -> list[_Field]:
    """The comma-separated fields of a line with their character columns (no quoting: SCALE-Sim
    splits on every comma)."""
    fields, start = [], 0
    for part in line.split(","):
        lead = len(part) - len(part.lstrip())
        fields.append(_Field(part.strip(), start + lead + 1))
        start += len(part) + 1
    return fields


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _header_format(cells: list[str]) -> _Format | None:
    """The format a header names, or None. Only the size columns are compared (SCALE-Sim's files
    spell the first one 'Layer' or 'Layer name')."""
    words = [_norm(c) for c in cells]
    for fmt in (CONV, GEMM):
        n = len(fmt.columns)
        if len(words) in (n, n + 1) and words[1:n] == [_norm(c) for c in fmt.columns[1:]]:
            return fmt
    return None


def read_topology(path: str | Path) -> Model:
    """Read a SCALE-Sim topology CSV into a `Model` (one `Layer` a row, `source` "file:line").

    Raises `ModelError` naming the file, line and column for a malformed row, an unknown header
    (neither conv nor GEMM: an unknown layer type), a depthwise ('DP') row, a filter larger
    than its ifmap, a non-positive size or stride.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read the topology file ({exc.strerror})") from None
    lines = [(i, ln.rstrip("\r\n")) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ModelError(f"{path}: the topology file is empty")
    head_no, head = lines[0]
    fmt = _header_format([f.text for f in _split(head.rstrip().rstrip(","))])
    if fmt is None:
        raise ModelError(
            f"{path}:{head_no}: unknown layer type: the header {head.strip()!r} is neither a "
            f"conv topology ({', '.join(CONV_COLUMNS)},) nor a GEMM one "
            f"({', '.join(GEMM_COLUMNS)},)")
    layers = tuple(_layer(path, no, ln, fmt) for no, ln in lines[1:])
    if not layers:
        raise ModelError(f"{path}: the topology file has a header but no layers")
    notes = ("SCALE-Sim topology: every row is an independent layer reading its own ifmap",)
    return Model(name=path.stem, layers=layers, source=str(path), notes=notes).verify()


def _layer(path: Path, no: int, line: str, fmt: _Format) -> Layer:
    where = f"{path}:{no}"
    stripped = line.rstrip()
    if not stripped.endswith(","):
        raise ModelError(f"{where}:{len(stripped) + 1}: the row does not end with a comma "
                         "(SCALE-Sim drops the last field of every row)")
    fields = _split(stripped)[:-1]
    n = len(fmt.columns)
    if len(fields) not in (n, n + 1):
        col = fields[min(len(fields), n + 1) - 1].column if len(fields) > n else len(stripped)
        raise ModelError(f"{where}:{col}: expected {n} fields ({', '.join(fmt.columns)}), "
                         f"got {len(fields)}")
    if len(fields) == n + 1 and fields[n].text.replace(" ", "") not in ("1:1", ""):
        raise ModelError(f"{where}:{fields[n].column}: sparsity ratio {fields[n].text!r} is not "
                         "supported (only dense, 1:1)")
    name = fields[0].text
    if not name:
        raise ModelError(f"{where}:{fields[0].column}: the layer has no name")
    if "DP" in name and fmt is CONV:
        raise ModelError(f"{where}:{fields[0].column}: unknown layer type: depthwise row "
                         f"{name!r} ('DP' in the name) is not supported")
    values = {}
    for key, col_name, f in zip(fmt.sizes, fmt.columns[1:], fields[1:n]):
        try:
            v = int(f.text)
        except ValueError:
            raise ModelError(f"{where}:{f.column}: {col_name} must be an integer, "
                             f"got {f.text!r}") from None
        if v <= 0:
            what = "stride" if key == "stride" else col_name
            raise ModelError(f"{where}:{f.column}: {what} must be positive, got {v}")
        values[key] = v
    if fmt is CONV:
        for filt, ifm, fc, ic in (("r", "h", 3, 1), ("s", "w", 4, 2)):
            if values[filt] > values[ifm]:
                raise ModelError(
                    f"{where}:{fields[fc].column}: shapes do not agree: {fmt.columns[fc]} "
                    f"{values[filt]} is larger than {fmt.columns[ic]} {values[ifm]}")
        sizes = tuple((k, values[k]) for k in CONV_SIZES)
        return Layer(name=name, kind=LayerKind.CONV2D, sizes=sizes, inputs=(MODEL_INPUT,),
                     op=SCALESIM_SIZING, source=where)
    sizes = (("m", values["m"]), ("k", values["k"]), ("n", values["n"]))
    return Layer(name=name, kind=LayerKind.GEMM, sizes=sizes, inputs=(MODEL_INPUT,),
                 op=SCALESIM_SIZING, source=where)
