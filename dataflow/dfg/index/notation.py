"""Index notation: `C[i,j] += A[i,k] * B[k,j]` parsed into a `Statement`.

The grammar is a Python assignment (parsed with the standard `ast` module): a left-hand access
`T[i, j, ...]`, `=` or `+=`, and a right-hand side that is a product of accesses
(`A[i,k] * B[k,j] * M[i,j]`, left-associated) or a sum of two (`A[i,j] + B[i,j]`, the union of
their stored entries). Index variables that appear only on the right are reductions: their
products are summed into the left-hand side, which starts at zero (TACO's semantics).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from enum import Enum

from dataflow.dfg.graph import DFGError


class Combine(str, Enum):
    """How the right-hand accesses combine: a product (intersection of stored entries) or a
    sum (union)."""

    PRODUCT = "*"
    SUM = "+"


@dataclass(frozen=True)
class Access:
    """`tensor[indices]`: one tensor read (or written) at index variables."""

    tensor: str
    indices: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.tensor}[{','.join(self.indices)}]"


@dataclass(frozen=True)
class Statement:
    """`output (+)= factors[0] combine factors[1] combine ...`."""

    output: Access
    factors: tuple[Access, ...]
    combine: Combine = Combine.PRODUCT
    accumulate: bool = False  # `+=`: add into the output instead of overwriting it

    @property
    def index_vars(self) -> tuple[str, ...]:
        """Every index variable, left-hand side first, then in order of appearance."""
        seen: list[str] = []
        for acc in (self.output, *self.factors):
            seen += [v for v in acc.indices if v not in seen]
        return tuple(seen)

    @property
    def reduction_vars(self) -> tuple[str, ...]:
        """Variables of the right-hand side only: summed over."""
        return tuple(v for v in self.index_vars if v not in self.output.indices)

    @property
    def elementwise(self) -> bool:
        """Every access uses the output's variables in the output's order."""
        return all(f.indices == self.output.indices for f in self.factors)

    def __str__(self) -> str:
        rhs = f" {self.combine.value} ".join(str(f) for f in self.factors)
        return f"{self.output} {'+=' if self.accumulate else '='} {rhs}"


def _access(node: ast.expr, text: str) -> Access:
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
        raise DFGError(f"index notation {text!r}: expected an access like A[i,k], got "
                       f"{ast.unparse(node)!r}")
    idx = node.slice
    parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
    if not all(isinstance(p, ast.Name) for p in parts):
        raise DFGError(f"index notation {text!r}: indices of {node.value.id} must be plain "
                       f"variable names, got {ast.unparse(idx)!r}")
    names = tuple(p.id for p in parts)
    if len(set(names)) != len(names):
        raise DFGError(f"index notation {text!r}: {node.value.id} repeats an index "
                       f"({', '.join(names)}); a diagonal is not supported")
    return Access(node.value.id, names)


def _factors(node: ast.expr, text: str) -> tuple[tuple[Access, ...], Combine]:
    """The accesses of a left-associated chain of one operator."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
        combine = Combine.PRODUCT if isinstance(node.op, ast.Mult) else Combine.SUM
        left = node.left
        chain = [_access(node.right, text)]
        while isinstance(left, ast.BinOp):
            if type(left.op) is not type(node.op):
                raise DFGError(f"index notation {text!r}: the right-hand side is a product or "
                               "a sum of accesses, not both")
            chain.append(_access(left.right, text))
            left = left.left
        chain.append(_access(left, text))
        return tuple(reversed(chain)), combine
    return (_access(node, text),), Combine.PRODUCT


def parse_statement(text: str) -> Statement:
    """Parse `text` (e.g. ``"C[i,j] += A[i,k] * B[k,j]"``); raises DFGError naming the part
    that is not index notation."""
    try:
        tree = ast.parse(text.strip(), mode="exec")
    except SyntaxError as e:
        raise DFGError(f"index notation {text!r}: {e.msg}") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], (ast.Assign, ast.AugAssign)):
        raise DFGError(f"index notation {text!r}: expected one assignment, "
                       "e.g. C[i,j] += A[i,k] * B[k,j]")
    stmt = tree.body[0]
    if isinstance(stmt, ast.AugAssign):
        if not isinstance(stmt.op, ast.Add):
            raise DFGError(f"index notation {text!r}: only '=' and '+=' assign")
        target, accumulate = stmt.target, True
    else:
        if len(stmt.targets) != 1:
            raise DFGError(f"index notation {text!r}: one left-hand side")
        target, accumulate = stmt.targets[0], False
    factors, combine = _factors(stmt.value, text)
    out = _access(target, text)
    if any(f.tensor == out.tensor for f in factors):
        raise DFGError(f"index notation {text!r}: {out.tensor} is both read and written")
    if combine is Combine.SUM and any(f.indices != out.indices for f in factors):
        raise DFGError(f"index notation {text!r}: a sum adds accesses of the output's indices "
                       f"({','.join(out.indices)})")
    missing = [v for v in out.indices if not any(v in f.indices for f in factors)]
    if missing:
        raise DFGError(f"index notation {text!r}: output index {missing[0]!r} appears on no "
                       "right-hand access (a broadcast is not supported)")
    return Statement(out, factors, combine, accumulate)
