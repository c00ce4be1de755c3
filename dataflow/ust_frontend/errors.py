"""The one error type of the UST format language."""

from __future__ import annotations

from dataflow.errors import UserError

#: Longest source text echoed in a message; a longer one shows a window around the column.
ECHO_LIMIT = 120
#: Characters shown on each side of the offending column when the source is cut.
ECHO_WINDOW = 40
#: Longest detail text kept (details quote names and levels taken from the source).
DETAIL_LIMIT = 300


class FormatError(UserError):
    """A tensor format string (or programmatic format) that breaks a rule of the language.

    Attributes:
        rule: short kebab-case name of the broken rule (``"syntax"``, ``"div-unmatched"``, ...).
        column: 0-based column in ``source`` where the offending level or token starts,
            or None when the format was not built from a string.
        source: the format string, or None.
        detail: the message without the source excerpt.

    The rendered message stays short whatever the input: a long source is shown as a window of
    ``2 * ECHO_WINDOW`` characters around the column, and the detail is cut at DETAIL_LIMIT.
    """

    def __init__(self, rule: str, detail: str, source: str | None = None,
                 column: int | None = None):
        self.rule = rule
        self.detail = detail
        self.source = source
        self.column = column
        super().__init__(self._render())

    def _render(self) -> str:
        detail = _cut(self.detail, DETAIL_LIMIT)
        head = f"[{self.rule}] {detail}"
        if self.source is None:
            return head
        if self.column is None:
            return f"{head}\n  in {_cut(self.source, ECHO_LIMIT)!r}"
        start, text = 0, self.source
        if len(text) > ECHO_LIMIT:
            start = max(0, self.column - ECHO_WINDOW)
            text = text[start: self.column + ECHO_WINDOW]
        # The caret line is aligned under the quoted source (the leading quote is 1 char).
        quoted = repr(text)
        shift = 1 + _escaped_len(text[: self.column - start])
        lead = "..." if start else ""
        tail = "..." if start + len(text) < len(self.source) else ""
        return (f"{head} (column {self.column})\n  {lead}{quoted}{tail}\n"
                f"  {' ' * (len(lead) + shift)}^")

    def with_source(self, source: str, offset: int = 0) -> FormatError:
        """The same error re-anchored in a larger source string (column shifted by offset)."""
        column = None if self.column is None else self.column + offset
        return FormatError(self.rule, self.detail, source, column)


class FormatTypeError(FormatError, TypeError):
    """A format built from a value of the wrong Python type (``TensorFormat(42)``).

    Also a TypeError, so callers that caught the TypeError of earlier versions still do.
    """


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _escaped_len(text: str) -> int:
    return len(repr(text)) - 2
