"""``NamedFormats``: the common formats, as format strings (names follow nvmath-python)."""

from __future__ import annotations

from functools import cache

from .errors import FormatError
from .format import TensorFormat


@cache
def _fmt(source: str, name: str) -> TensorFormat:
    return TensorFormat(source, name=name)


def _dim_names(rank: int) -> list[str]:
    return ["i", "j", "k", "l"][:rank] if rank <= 4 else [f"d{k}" for k in range(rank)]


def _pair(m, n) -> tuple[int, int]:
    if n is None:
        if not (isinstance(m, tuple) and len(m) == 2):
            raise FormatError("named-format", f"block sizes are (m, n), got {m!r}")
        return m
    return m, n


def _blocked(blocks: tuple[int, ...], swap: bool, name: str) -> TensorFormat:
    names = _dim_names(len(blocks))
    if len(blocks) < 2:
        raise FormatError("named-format", f"{name} needs at least two block sizes")
    grid = [f"{d} / {b}" for d, b in zip(names, blocks)]
    if swap:
        grid[-2], grid[-1] = grid[-1], grid[-2]
    lvls = [f"{g} : dense" for g in grid[:-1]] + [f"{grid[-1]} : compressed"]
    lvls += [f"{d} % {b} : dense" for d, b in zip(names, blocks)]
    return _fmt(f"({', '.join(names)}) -> ({', '.join(lvls)})", f"{name}{blocks}")


class _Builders:
    """Formats with parameters (block sizes, bit widths, ranks)."""

    @staticmethod
    def dense(rank: int, order: str = "C") -> TensorFormat:
        """An all-dense format; ``order="C"`` is row-major (last dimension innermost),
        "F" column-major."""
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
    def DensedRight(rank: int) -> TensorFormat:
        """nvmath's name: an all-dense format of any rank, row-major."""
        return _Builders.dense(rank, "C")

    @staticmethod
    def DensedLeft(rank: int) -> TensorFormat:
        """nvmath's name: an all-dense format of any rank, column-major."""
        return _Builders.dense(rank, "F")

    @staticmethod
    def COOd(rank: int) -> TensorFormat:
        """nvmath's name of ``coo(rank)``."""
        return _Builders.coo(rank)

    @staticmethod
    def CSFd(rank: int) -> TensorFormat:
        """nvmath's name of ``csf(rank)``."""
        return _Builders.csf(rank)

    @staticmethod
    def CSRd(rank: int) -> TensorFormat:
        """CSR of any rank: dense outer levels, the last dimension compressed."""
        names = _dim_names(rank)
        lvls = [f"{d} : dense" for d in names[:-1]] + [f"{names[-1]} : compressed"]
        return _fmt(f"({', '.join(names)}) -> ({', '.join(lvls)})", f"CSR{rank}")

    @staticmethod
    def CSCd(rank: int) -> TensorFormat:
        """CSC of any rank: the last two dimensions swapped, the row dimension compressed."""
        if rank < 2:
            raise FormatError("named-format", f"CSCd needs rank >= 2, got {rank}")
        names = _dim_names(rank)
        lvls = [f"{d} : dense" for d in names[:-2]]
        lvls += [f"{names[-1]} : dense", f"{names[-2]} : compressed"]
        return _fmt(f"({', '.join(names)}) -> ({', '.join(lvls)})", f"CSC{rank}")

    @staticmethod
    def BSRRightd(blocks: tuple[int, ...]) -> TensorFormat:
        """Block sparse of rank len(blocks): the block grid dense except its last level
        (compressed), then the dimensions inside a block row-major."""
        return _blocked(tuple(blocks), swap=False, name="BSRRightd")

    @staticmethod
    def BSCRightd(blocks: tuple[int, ...]) -> TensorFormat:
        """``BSRRightd`` with the last two block-grid levels swapped (block columns outer)."""
        return _blocked(tuple(blocks), swap=True, name="BSCRightd")

    @staticmethod
    def BSR3(blocks: tuple[int, int, int]) -> TensorFormat:
        """Rank-3 block sparse row (``BSRRightd`` with three block sizes)."""
        if len(blocks) != 3:
            raise FormatError("named-format", f"BSR3 takes three block sizes, got {blocks!r}")
        return _blocked(tuple(blocks), swap=False, name="BSR3")

    @staticmethod
    def BlockVector(b: int) -> TensorFormat:
        """A sparse vector of dense blocks of size b."""
        return _fmt(f"(i) -> (i / {b} : compressed, i % {b} : dense)", f"BlockVector({b})")

    @staticmethod
    def BSRRight(m: int | tuple[int, int], n: int | None = None) -> TensorFormat:
        """Block sparse row with m x n blocks stored row-major (scipy's and torch's BSR).
        Takes ``(m, n)`` or a tuple ``((m, n))`` as nvmath does; so do the other BSR/BSC."""
        m, n = _pair(m, n)
        return _fmt(f"(i, j) -> (i / {m} : dense, j / {n} : compressed, i % {m} : dense, "
                    f"j % {n} : dense)", f"BSRRight({m}, {n})")

    @staticmethod
    def BSRLeft(m: int | tuple[int, int], n: int | None = None) -> TensorFormat:
        """Block sparse row with m x n blocks stored column-major."""
        m, n = _pair(m, n)
        return _fmt(f"(i, j) -> (i / {m} : dense, j / {n} : compressed, j % {n} : dense, "
                    f"i % {m} : dense)", f"BSRLeft({m}, {n})")

    @staticmethod
    def BSCRight(m: int | tuple[int, int], n: int | None = None) -> TensorFormat:
        """Block sparse column with m x n blocks stored row-major."""
        m, n = _pair(m, n)
        return _fmt(f"(i, j) -> (j / {n} : dense, i / {m} : compressed, i % {m} : dense, "
                    f"j % {n} : dense)", f"BSCRight({m}, {n})")

    @staticmethod
    def BSCLeft(m: int | tuple[int, int], n: int | None = None) -> TensorFormat:
        """Block sparse column with m x n blocks stored column-major."""
        m, n = _pair(m, n)
        return _fmt(f"(i, j) -> (j / {n} : dense, i / {m} : compressed, j % {n} : dense, "
                    f"i % {m} : dense)", f"BSCLeft({m}, {n})")

    @staticmethod
    def BSR(m: int | tuple[int, int], n: int | None = None) -> TensorFormat:
        """Alias of ``BSRRight``."""
        return _Builders.BSRRight(m, n)

    @staticmethod
    def BSC(m: int | tuple[int, int], n: int | None = None) -> TensorFormat:
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
    # nvmath's BatchedCSR stores the batch as a dense level; torch's batched CSR (one shared
    # sparsity count per batch) is the batch-level one.
    BatchedCSR = _fmt("(b, i, j) -> (b : dense, i : dense, j : compressed)", "BatchedCSR")
    TorchBatchedCSR = _fmt("(b, i, j) -> (b : batch, i : dense, j : compressed)",
                           "TorchBatchedCSR")
    BatchedDIAIUniform = _fmt("(b, i, j) -> (j - i : compressed, b : dense, i : range)",
                              "BatchedDIAIUniform")
    BatchedDIAINonUniform = _fmt("(b, i, j) -> (b : dense, j - i : compressed, i : range)",
                                 "BatchedDIAINonUniform")
    BatchedDenseMatrix = _fmt("(b, i, j) -> (b : batch, i : dense, j : dense)",
                              "BatchedDenseMatrix")


#: scipy's DIA layout (data[k, j] holds A[j - offsets[k], j]).
DIA = NamedFormats.DIAJ
