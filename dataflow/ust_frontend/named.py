"""``NamedFormats``: the common formats, as format strings (names follow nvmath-python)."""

from __future__ import annotations

from functools import cache

from .format import TensorFormat


@cache
def _fmt(source: str, name: str) -> TensorFormat:
    return TensorFormat(source, name=name)


def _dim_names(rank: int) -> list[str]:
    return ["i", "j", "k", "l"][:rank] if rank <= 4 else [f"d{k}" for k in range(rank)]


class _Builders:
    """Formats with parameters (block sizes, bit widths, ranks)."""

    @staticmethod
    def dense(rank: int, order: str = "C") -> TensorFormat:
        """An all-dense format; ``order="C"`` is row-major (last dimension innermost), "F" column-major."""
        names = _dim_names(rank)
        lvls = names if order == "C" else names[::-1]
        return _fmt(f"({', '.join(names)}) -> ({', '.join(f'{d} : dense' for d in lvls)})",
                    f"Dense{rank}{order}")

    @staticmethod
    def coo(rank: int) -> TensorFormat:
        """COO of any rank: a nonunique compressed level, then singleton levels."""
        names = _dim_names(rank)
        lvls = [f"{names[0]} : compressed(nonunique)"]
        lvls += [f"{d} : singleton(nonunique)" for d in names[1:-1]]
        if rank > 1:
            lvls.append(f"{names[-1]} : singleton")
        return _fmt(f"({', '.join(names)}) -> ({', '.join(lvls)})",
                    "COO" if rank == 2 else f"COO{rank}")

    @staticmethod
    def csf(rank: int) -> TensorFormat:
        """Compressed sparse fibre: every level compressed, identity order."""
        names = _dim_names(rank)
        return _fmt(f"({', '.join(names)}) -> ({', '.join(f'{d} : compressed' for d in names)})",
                    f"CSF{rank}")

    @staticmethod
    def BSRRight(m: int, n: int) -> TensorFormat:
        """Block sparse row with m x n blocks stored row-major (scipy's and torch's BSR)."""
        return _fmt(f"(i, j) -> (i / {m} : dense, j / {n} : compressed, i % {m} : dense, "
                    f"j % {n} : dense)", f"BSRRight({m}, {n})")

    @staticmethod
    def BSRLeft(m: int, n: int) -> TensorFormat:
        """Block sparse row with m x n blocks stored column-major."""
        return _fmt(f"(i, j) -> (i / {m} : dense, j / {n} : compressed, j % {n} : dense, "
                    f"i % {m} : dense)", f"BSRLeft({m}, {n})")

    @staticmethod
    def BSCRight(m: int, n: int) -> TensorFormat:
        """Block sparse column with m x n blocks stored row-major."""
        return _fmt(f"(i, j) -> (j / {n} : dense, i / {m} : compressed, i % {m} : dense, "
                    f"j % {n} : dense)", f"BSCRight({m}, {n})")

    @staticmethod
    def BSCLeft(m: int, n: int) -> TensorFormat:
        """Block sparse column with m x n blocks stored column-major."""
        return _fmt(f"(i, j) -> (j / {n} : dense, i / {m} : compressed, j % {n} : dense, "
                    f"i % {m} : dense)", f"BSCLeft({m}, {n})")

    @staticmethod
    def BSR(m: int, n: int) -> TensorFormat:
        """Alias of ``BSRRight``."""
        return _Builders.BSRRight(m, n)

    @staticmethod
    def BSC(m: int, n: int) -> TensorFormat:
        """Alias of ``BSCRight``."""
        return _Builders.BSCRight(m, n)

    @staticmethod
    def NM(n: int, m: int) -> TensorFormat:
        """N:M structured sparsity along rows: at most n nonzeros in each group of m columns."""
        return _fmt(f"(i, j) -> (i : dense, j / {m} : dense, j % {m} : structured[{n}, {m}])",
                    f"{n}:{m}")

    @staticmethod
    def DELTA(bits: int) -> TensorFormat:
        """CSR whose column indices are gap-coded in ``bits`` bits."""
        return _fmt(f"(i, j) -> (i : dense, j : delta({bits}))", f"DELTA({bits})")


class NamedFormats(_Builders):
    """Predefined formats. Attributes are ``TensorFormat`` objects; builders are static methods."""

    Scalar = _fmt("() -> ()", "Scalar")
    DenseVector = _fmt("(i) -> (i : dense)", "DenseVector")
    DenseMatrixRight = _fmt("(i, j) -> (i : dense, j : dense)", "DenseMatrixRight")
    DenseMatrixLeft = _fmt("(i, j) -> (j : dense, i : dense)", "DenseMatrixLeft")
    SparseVector = _fmt("(i) -> (i : compressed)", "SparseVector")
    COO = _fmt("(i, j) -> (i : compressed(nonunique), j : singleton)", "COO")
    CSR = _fmt("(i, j) -> (i : dense, j : compressed)", "CSR")
    CSC = _fmt("(i, j) -> (j : dense, i : compressed)", "CSC")
    DCSR = _fmt("(i, j) -> (i : compressed, j : compressed)", "DCSR")
    DCSC = _fmt("(i, j) -> (j : compressed, i : compressed)", "DCSC")
    CROW = _fmt("(i, j) -> (i : compressed, j : dense)", "CROW")
    CCOL = _fmt("(i, j) -> (j : compressed, i : dense)", "CCOL")
    DIAI = _fmt("(i, j) -> (j - i : compressed, i : range)", "DIAI")
    DIAJ = _fmt("(i, j) -> (j - i : compressed, j : range)", "DIAJ")
    SkewDIAI = _fmt("(i, j) -> (i + j : compressed, i : range)", "SkewDIAI")
    SkewDIAJ = _fmt("(i, j) -> (i + j : compressed, j : range)", "SkewDIAJ")
    # ELL: each row owns a fixed-width slot range; loose_compressed keeps per-row [lo, hi).
    ELL = _fmt("(i, j) -> (i : dense, j : loose_compressed)", "ELL")
    BatchedCSR = _fmt("(b, i, j) -> (b : batch, i : dense, j : compressed)", "BatchedCSR")
    BatchedDenseMatrix = _fmt("(b, i, j) -> (b : batch, i : dense, j : dense)",
                              "BatchedDenseMatrix")


#: scipy's DIA layout (data[k, j] holds A[j - offsets[k], j]).
DIA = NamedFormats.DIAJ
