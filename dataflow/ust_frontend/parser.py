"""Parser of the UST format DSL (nvmath-python grammar plus MLIR spellings).

    source  ::= map
              | '#sparse_tensor.encoding' '<' '{' entry {',' entry} '}' '>'
    entry   ::= 'map' '=' map | ('posWidth' | 'crdWidth') '=' int
              | ('explicitVal' | 'implicitVal') '=' value
    map     ::= ['[' sym {',' sym} ']'] ['{' lvar {',' lvar} '}']
                '(' [dim {',' dim}] ')' '->' '(' [level {',' level}] ')'
    dim     ::= name ['=' expr] [':' '#sparse_tensor' '<' 'slice' '(' sv ',' sv ',' sv ')' '>']
    level   ::= [lvar '='] expr ':' type
    expr    ::= term {('+' | '-') term}
    term    ::= atom {('*' | '/' | '//' | 'floordiv' | '%' | 'mod') atom}
    atom    ::= name | int | '-' int | '(' expr ')'
    type    ::= name ['(' int ')'] ['[' int ',' int ']'] ['(' prop {',' prop} ')']

Level variables (``{l0, l1}``), their uses in the level list and the dimension bindings
(``d0 = l0``) are checked here as far as they are syntax (declared, in order); whether the
bindings invert the levels is a semantic rule (``rules.check_bindings``). Expressions are capped
in depth and size, so no input reaches Python's recursion limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import FormatError
from .levels import (
    MAX_EXPR_DEPTH,
    MAX_EXPR_NODES,
    MAX_PAREN_DEPTH,
    BinOp,
    Const,
    Dim,
    DimSlice,
    LevelExpr,
    LevelFormat,
    LevelSpec,
    LevelType,
    Sym,
    expr_shape,
)

_TOKEN = re.compile(r"\s*(?:(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<int>\d+)"
                    r"|(?P<punct>->|//|[()\[\]{},:+\-*/%#<>=.?]))")

_TYPE_NAMES = {f.value: f for f in LevelFormat}
_PROPERTIES = {"unique", "nonunique", "ordered", "unordered", "nonordered", "soa"}
_LEGACY_BLOCK = re.compile(r"block(\d+)_(\d+)")
#: MLIR index widths (0: the platform's index type).
INDEX_WIDTHS = (0, 8, 16, 32, 64)
_WIDTH_KEYS = {"posWidth": "pos_width", "crdWidth": "crd_width"}
_VALUE_KEYS = {"explicitVal", "implicitVal"}
_LEGACY_KEYS = {"lvlTypes", "dimLevelType", "dimToLvl", "lvlToDim", "dimOrdering",
                "dimSlices", "pointerBitWidth", "indexBitWidth", "higherOrdering"}


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "int", "punct" or "end"
    text: str
    column: int


@dataclass(frozen=True)
class ParsedFormat:
    """What a format string spells, before the semantic rules.

    ``bindings`` holds, per dimension, MLIR's ``d = expr`` over the level variables (or None);
    ``level_vars`` the declared level-variable names, in order (empty when none declared).
    """

    dims: tuple[Dim, ...]
    levels: tuple[LevelSpec, ...]
    symbols: tuple[Sym, ...] = ()
    slices: tuple[DimSlice | None, ...] = ()
    bindings: tuple[LevelExpr | None, ...] = ()
    level_vars: tuple[Dim, ...] = ()
    pos_width: int = 0
    crd_width: int = 0


def tokenize(source: str) -> list[Token]:
    tokens, at = [], 0
    while True:
        match = _TOKEN.match(source, at)
        if match is None:
            rest = len(source) - len(source[at:].lstrip())
            if rest == len(source):
                break
            raise FormatError("syntax", f"unexpected character {source[rest]!r}", source, rest)
        kind = match.lastgroup
        tokens.append(Token(kind, match.group(kind), match.start(kind)))
        at = match.end()
    tokens.append(Token("end", "", len(source)))
    return tokens


class _Parser:
    def __init__(self, source: str):
        self.source = source
        self.tokens = tokenize(source)
        self.at = 0
        self.symbols: dict[str, Sym] = {}
        self.depth = 0
        self.widths = {"pos_width": 0, "crd_width": 0}

    # -- token helpers ----------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.at]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def fail(self, detail: str, token: Token | None = None, rule: str = "syntax"):
        token = token or self.tok
        raise FormatError(rule, detail, self.source, token.column)

    def found(self) -> str:
        return repr(self.tok.text or "end of input")

    def accept(self, text: str) -> Token | None:
        if self.tok.kind != "end" and self.tok.text == text:
            self.at += 1
            return self.tokens[self.at - 1]
        return None

    def expect(self, text: str, what: str | None = None) -> Token:
        token = self.accept(text)
        if token is None:
            self.fail(f"expected {what or repr(text)}, found {self.found()}")
        return token

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            self.fail(f"expected {what}, found {self.found()}")
        self.at += 1
        return self.tokens[self.at - 1]

    def names(self, close: str, what: str) -> list[Token]:
        """``name {',' name} close`` after an opening bracket (at least one name)."""
        out = [self.expect_kind("ident", what)]
        while not self.accept(close):
            self.expect(",", f"',' or {close!r} in the list of {what}s")
            out.append(self.expect_kind("ident", what))
        return out

    # -- grammar ----------------------------------------------------------------------------
    def parse(self) -> ParsedFormat:
        result = self.encoding() if self.tok.text == "#" else self.map()
        if self.tok.kind != "end":
            self.fail(f"unexpected {self.tok.text!r} after the format")
        return ParsedFormat(**{**result.__dict__, **self.widths})

    def encoding(self) -> ParsedFormat:
        self.expect("#")
        for word in ("sparse_tensor", ".", "encoding", "<"):
            self.expect(word, "'#sparse_tensor.encoding<{'")
        brace = self.expect("{")
        result = None
        while True:
            key = self.expect_kind("ident", "an encoding key such as 'map'")
            self.expect("=")
            if key.text == "map":
                result = self.map()
            elif key.text in _WIDTH_KEYS:
                self.width(key)
            elif key.text in _VALUE_KEYS:  # the value of unstored entries: no level structure
                self.skip_value()
            elif key.text in _LEGACY_KEYS:
                self.fail(f"{key.text!r} is MLIR's legacy encoding syntax; write "
                          "'map = (d0, ...) -> (d0 : dense, ...)'", key, rule="encoding-key")
            else:
                self.fail(f"unknown encoding key {key.text!r} (known: map, posWidth, crdWidth, "
                          "explicitVal, implicitVal)", key, rule="encoding-key")
            if not self.accept(","):
                break
        self.expect("}")
        self.expect(">")
        if result is None:
            self.fail("the encoding has no 'map = ...' entry", brace)
        return result

    def width(self, key: Token):
        value = self.expect_kind("int", f"an integer bit width for {key.text!r}")
        bits = int(value.text)
        if bits not in INDEX_WIDTHS:
            self.fail(f"{key.text} = {bits}: the width must be one of "
                      f"{', '.join(map(str, INDEX_WIDTHS))}", value, rule="index-width")
        self.widths[_WIDTH_KEYS[key.text]] = bits

    def skip_value(self):
        depth = 0
        while self.tok.kind != "end":
            if depth == 0 and self.tok.text in (",", "}"):
                return
            depth += self.tok.text in "([{<"
            depth -= self.tok.text in ")]}>"
            self.at += 1

    def map(self) -> ParsedFormat:
        symbols: list[Sym] = []
        if self.accept("["):
            for token in self.names("]", "symbol"):
                symbols.append(Sym(token.text, token.column))
        self.symbols = {s.name: s for s in symbols}
        level_vars: list[Dim] = []
        if self.accept("{"):
            level_vars = [Dim(t.text, t.column) for t in self.names("}", "level variable")]
        self.expect("(", "'(' opening the dimension list")
        dims, slices, bindings = [], [], []
        if not self.accept(")"):
            while True:
                token = self.expect_kind("ident", "a dimension name")
                dims.append(Dim(token.text, token.column))
                bindings.append(self.expr() if self.accept("=") else None)
                slices.append(self.dim_slice() if self.accept(":") else None)
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the dimension list")
        arrow = self.expect("->")
        if any(b is not None for b in bindings) and not level_vars:
            self.fail("dimension bindings 'd = ...' need declared level variables '{l0, ...}'",
                      arrow, rule="level-var-undeclared")
        self.expect("(", "'(' opening the level list")
        levels, names = [], []
        if not self.accept(")"):
            while True:
                names.append(self.level_var())
                levels.append(self.level())
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the level list")
        self.level_vars_agree(level_vars, names, bindings, arrow)
        return ParsedFormat(tuple(dims), tuple(levels), tuple(symbols), tuple(slices),
                            tuple(bindings), tuple(level_vars))

    def dim_slice(self) -> DimSlice:
        for word in ("#", "sparse_tensor", "<", "slice", "("):
            self.expect(word, "'#sparse_tensor<slice(offset, size, stride)>'")
        values = []
        for k, what in enumerate(("offset", "size", "stride")):
            if k:
                self.expect(",")
            if self.accept("?"):
                values.append(None)
                continue
            token = self.tok
            value = self.signed_int()
            if value < (0 if what == "offset" else 1):
                self.fail(f"slice {what} {value}: offsets are >= 0, sizes and strides > 0 "
                          "(or '?')", token, rule="slice-value")
            values.append(value)
        self.expect(")")
        self.expect(">")
        return DimSlice(*values)

    def level_var(self) -> Token | None:
        if self.tok.kind == "ident" and self.peek().text == "=":
            self.at += 2
            return self.tokens[self.at - 2]
        return None

    def level_vars_agree(self, declared: list[Dim], named: list[Token | None],
                         bindings: list[LevelExpr | None], arrow: Token):
        position = {v.name: k for k, v in enumerate(declared)}
        for k, token in enumerate(named):
            if token is None:
                continue
            if token.text not in position:
                self.fail(f"level variable {token.text!r} is not declared in '{{...}}'", token,
                          rule="level-var-undeclared")
            if position[token.text] != k:
                self.fail(f"level variable {token.text!r} is declared as level "
                          f"{position[token.text]} but bound by level {k}", token,
                          rule="level-var-order")
        if declared and len(declared) != len(named):
            self.fail(f"{len(declared)} level variables declared but {len(named)} levels given",
                      arrow, rule="level-var-count")
        for binding in bindings:
            for name in _names_in(binding):
                if name.name not in position and name.name not in self.symbols:
                    self.fail(f"dimension binding uses {name.name!r}, which is not a declared "
                              "level variable", name, rule="level-var-undeclared")

    def level(self) -> LevelSpec:
        start = self.tok.column
        expr = self.expr()
        self.expect(":", "':' between a level expression and its type")
        return LevelSpec(expr, self.level_type(), start)

    def expr(self) -> LevelExpr:
        """An expression, refused when its tree is too deep or too large (see ``levels``)."""
        start = self.tok
        expr = self.sum()
        depth, nodes = expr_shape(expr)
        if depth > MAX_EXPR_DEPTH or nodes > MAX_EXPR_NODES:
            self.fail(f"expression too complex (at most depth {MAX_EXPR_DEPTH} and "
                      f"{MAX_EXPR_NODES} operands and operators)", start, rule="too-complex")
        return expr

    def sum(self) -> LevelExpr:
        start, nodes = self.tok, 1
        lhs = self.term()
        while self.tok.text in ("+", "-"):
            op = self.tok.text
            self.at += 1
            lhs = BinOp(op, lhs, self.term(), lhs.column)
            nodes += 1
            if nodes > MAX_EXPR_NODES:
                self.fail(f"expression longer than {MAX_EXPR_NODES} terms", start,
                          rule="too-complex")
        return lhs

    def term(self) -> LevelExpr:
        start, nodes = self.tok, 1
        lhs = self.atom()
        while self.tok.text in ("*", "/", "//", "floordiv", "%", "mod"):
            text = self.tok.text
            op = "*" if text == "*" else "%" if text in ("%", "mod") else "/"
            self.at += 1
            lhs = BinOp(op, lhs, self.atom(), lhs.column)
            nodes += 1
            if nodes > MAX_EXPR_NODES:
                self.fail(f"expression longer than {MAX_EXPR_NODES} factors", start,
                          rule="too-complex")
        return lhs

    def atom(self) -> LevelExpr:
        token = self.tok
        if token.kind == "ident" and token.text not in ("floordiv", "mod"):
            self.at += 1
            if token.text in self.symbols:
                return Sym(token.text, token.column)
            return Dim(token.text, token.column)
        if token.kind == "int":
            self.at += 1
            return Const(int(token.text), token.column)
        if token.text == "-" and self.peek().kind == "int":
            self.at += 2
            return Const(-int(self.tokens[self.at - 1].text), token.column)
        if self.accept("("):
            self.depth += 1
            if self.depth > MAX_PAREN_DEPTH:
                self.fail(f"parentheses nested deeper than {MAX_PAREN_DEPTH}", token,
                          rule="too-complex")
            inner = self.sum()
            self.expect(")")
            self.depth -= 1
            return inner
        self.fail(f"expected a dimension, a constant or '(', found {self.found()}")

    def level_type(self) -> LevelType:
        name = self.tok
        if name.kind != "ident":
            self.fail(f"expected a level type, found {self.found()}")
        legacy = _LEGACY_BLOCK.fullmatch(name.text)
        if legacy:
            self.fail(f"{name.text!r} is MLIR's legacy spelling; write "
                      f"structured[{legacy.group(1)}, {legacy.group(2)}]",
                      rule="unknown-level-type")
        if name.text not in _TYPE_NAMES:
            known = ", ".join(sorted(_TYPE_NAMES))
            self.fail(f"unknown level type {name.text!r} (known: {known})",
                      rule="unknown-level-type")
        self.at += 1
        fmt = _TYPE_NAMES[name.text]
        params: tuple[int, ...] = ()
        if fmt is LevelFormat.DELTA:
            self.expect("(", "'(' and the bit width after 'delta'")
            params = (self.signed_int(),)
            self.expect(")")
        elif fmt is LevelFormat.STRUCTURED:
            self.expect("[", "'[n, m]' after 'structured'")
            n = self.signed_int()
            self.expect(",")
            params = (n, self.signed_int())
            self.expect("]")
        props: list[Token] = []
        if self.accept("("):
            while True:
                token = self.expect_kind("ident", "a level property")
                if token.text not in _PROPERTIES:
                    self.fail(f"unknown level property {token.text!r} (known: "
                              f"{', '.join(sorted(_PROPERTIES))})", token,
                              rule="unknown-property")
                props.append(token)
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the property list")
        return self.properties(LevelType(fmt, params=params), props)

    def signed_int(self) -> int:
        sign = -1 if self.accept("-") else 1
        return sign * int(self.expect_kind("int", "an integer").text)

    def properties(self, base: LevelType, props: list[Token]) -> LevelType:
        seen: dict[str, Token] = {}
        for token in props:
            word = "unordered" if token.text == "nonordered" else token.text
            for a, b in (("unique", "nonunique"), ("ordered", "unordered")):
                other = b if word == a else a if word == b else None
                if other is not None and other in seen:
                    self.fail(f"contradictory level properties {seen[other].text!r} and "
                              f"{token.text!r}", token, rule="contradictory-properties")
            seen[word] = token
        return LevelType(base.format, unique="nonunique" not in seen,
                         ordered="unordered" not in seen, params=base.params,
                         soa="soa" in seen)


def _names_in(expr: LevelExpr | None) -> list[Dim | Sym]:
    """The named operands of a (parser-bounded) expression."""
    if isinstance(expr, (Dim, Sym)):
        return [expr]
    if isinstance(expr, BinOp):
        return _names_in(expr.lhs) + _names_in(expr.rhs)
    return []


def parse_format(source: str) -> ParsedFormat:
    """Parse a format string into dimensions and levels (syntax only)."""
    return _Parser(source).parse()
