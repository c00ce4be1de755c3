"""Parser of the UST format DSL (nvmath-python grammar plus MLIR spellings).

    format  ::= '(' [dim {',' dim}] ')' '->' '(' [level {',' level}] ')'
              | '#sparse_tensor.encoding' '<' '{' 'map' '=' format {',' key '=' value} '}' '>'
    level   ::= expr ':' type
    expr    ::= term {('+' | '-') term}
    term    ::= atom {('/' | '//' | 'floordiv' | '%' | 'mod') atom}
    atom    ::= dim | int | '-' int | '(' expr ')'
    type    ::= name ['(' int ')'] ['[' int ',' int ']'] ['(' prop {',' prop} ')']

Only syntax is checked here; the semantic rules live in ``rules.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import FormatError
from .levels import BinOp, Const, Dim, LevelExpr, LevelFormat, LevelSpec, LevelType

_TOKEN = re.compile(r"\s*(?:(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<int>\d+)"
                    r"|(?P<punct>->|//|[()\[\]{},:+\-/%#<>=.]))")

_TYPE_NAMES = {f.value: f for f in LevelFormat}
_PROPERTIES = {"unique", "nonunique", "ordered", "unordered", "nonordered", "soa"}


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "int", "punct" or "end"
    text: str
    column: int


@dataclass(frozen=True)
class ParsedFormat:
    dims: tuple[Dim, ...]
    levels: tuple[LevelSpec, ...]


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

    # -- token helpers ----------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.at]

    def fail(self, detail: str, token: Token | None = None, rule: str = "syntax"):
        token = token or self.tok
        raise FormatError(rule, detail, self.source, token.column)

    def accept(self, text: str) -> Token | None:
        if self.tok.kind != "end" and self.tok.text == text:
            self.at += 1
            return self.tokens[self.at - 1]
        return None

    def expect(self, text: str, what: str | None = None) -> Token:
        token = self.accept(text)
        if token is None:
            found = self.tok.text or "end of input"
            self.fail(f"expected {what or repr(text)}, found {found!r}")
        return token

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            self.fail(f"expected {what}, found {self.tok.text or 'end of input'!r}")
        self.at += 1
        return self.tokens[self.at - 1]

    # -- grammar ----------------------------------------------------------------------------
    def parse(self) -> ParsedFormat:
        result = self.mlir() if self.tok.text == "#" else self.format()
        if self.tok.kind != "end":
            self.fail(f"unexpected {self.tok.text!r} after the format")
        return result

    def mlir(self) -> ParsedFormat:
        self.expect("#")
        for word in ("sparse_tensor", ".", "encoding", "<"):
            self.expect(word, "'#sparse_tensor.encoding<{'")
        brace = self.expect("{")
        result = None
        while True:
            key = self.expect_kind("ident", "an encoding key such as 'map'")
            self.expect("=")
            if key.text == "map":
                result = self.format()
            else:  # posWidth, crdWidth, explicitVal, ...: not part of the level structure
                self.skip_value()
            if not self.accept(","):
                break
        self.expect("}")
        self.expect(">")
        if result is None:
            self.fail("the encoding has no 'map = ...' entry", brace)
        return result

    def skip_value(self):
        depth = 0
        while self.tok.kind != "end":
            if depth == 0 and self.tok.text in (",", "}"):
                return
            depth += self.tok.text in "([{<"
            depth -= self.tok.text in ")]}>"
            self.at += 1

    def format(self) -> ParsedFormat:
        self.expect("(", "'(' opening the dimension list")
        dims = []
        if not self.accept(")"):
            while True:
                token = self.expect_kind("ident", "a dimension name")
                dims.append(Dim(token.text, token.column))
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the dimension list")
        self.expect("->")
        self.expect("(", "'(' opening the level list")
        levels = []
        if not self.accept(")"):
            while True:
                levels.append(self.level())
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the level list")
        return ParsedFormat(tuple(dims), tuple(levels))

    def level(self) -> LevelSpec:
        start = self.tok.column
        expr = self.expr()
        self.expect(":", "':' between a level expression and its type")
        return LevelSpec(expr, self.level_type(), start)

    def expr(self) -> LevelExpr:
        lhs = self.term()
        while self.tok.text in ("+", "-"):
            op = self.tok.text
            self.at += 1
            lhs = BinOp(op, lhs, self.term(), lhs.column)
        return lhs

    def term(self) -> LevelExpr:
        lhs = self.atom()
        while self.tok.text in ("/", "//", "floordiv", "%", "mod"):
            op = "/" if self.tok.text in ("/", "//", "floordiv") else "%"
            self.at += 1
            lhs = BinOp(op, lhs, self.atom(), lhs.column)
        return lhs

    def atom(self) -> LevelExpr:
        token = self.tok
        if token.kind == "ident" and token.text not in ("floordiv", "mod"):
            self.at += 1
            return Dim(token.text, token.column)
        if token.kind == "int":
            self.at += 1
            return Const(int(token.text), token.column)
        if token.text == "-" and self.tokens[self.at + 1].kind == "int":
            self.at += 2
            return Const(-int(self.tokens[self.at - 1].text), token.column)
        if self.accept("("):
            inner = self.expr()
            self.expect(")")
            return inner
        self.fail(f"expected a dimension, a constant or '(', found {token.text or 'end of input'!r}")

    def level_type(self) -> LevelType:
        name = self.tok
        if name.kind != "ident":
            self.fail(f"expected a level type, found {name.text or 'end of input'!r}")
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


def parse_format(source: str) -> ParsedFormat:
    """Parse a format string into dimensions and levels (syntax only)."""
    return _Parser(source).parse()
