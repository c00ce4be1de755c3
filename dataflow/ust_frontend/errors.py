"""The one error type of the UST format language."""

from __future__ import annotations

from dataflow.errors import UserError


class FormatError(UserError):
    """A tensor format string (or programmatic format) that breaks a rule of the language.

    Attributes:
        rule: short kebab-case name of the broken rule (``"syntax"``, ``"div-unmatched"``, ...).
        column: 0-based column in ``source`` where the offending level or token starts,
            or None when the format was not built from a string.
        source: the format string, or None.
        detail: the message without the source excerpt.
    """

    def __init__(self, rule: str, detail: str, source: str | None = None,
                 column: int | None = None):
        self.rule = rule
        self.detail = detail
        self.source = source
        self.column = column
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"[{self.rule}] {self.detail}"
        if self.source is None:
            return head
        if self.column is None:
            return f"{head}\n  in {self.source!r}"
        # The caret line is aligned under the quoted source (the leading quote is 1 char).
        quoted = repr(self.source)
        shift = 1 + _escaped_len(self.source[: self.column])
        return f"{head} (column {self.column})\n  {quoted}\n  {' ' * shift}^"

    def with_source(self, source: str, offset: int = 0) -> FormatError:
        """The same error re-anchored in a larger source string (column shifted by offset)."""
        column = None if self.column is None else self.column + offset
        return FormatError(self.rule, self.detail, source, column)


def _escaped_len(text: str) -> int:
    return len(repr(text)) - 2
