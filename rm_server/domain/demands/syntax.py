"""The surface syntax of the time-condition language: a lenient JSON reader with positions.

The paper (Wang Jian, on extending Hadoop YARN resource requests and allocation with time
factors) writes its conditions as JSON with unquoted keys and values:
``{DemandID: 1234, OrderBy: 1200, Time: {OR: [[NOW, +5m], [NOW, ^3]]}}``. This module
reads strict JSON and that style into a small generic tree (objects, arrays, scalars),
keeping the offset of every node so that `timelang` can report *where* a meaning error
is. It accepts, beyond JSON:

- unquoted keys: ``DemandID: 1234``;
- unquoted scalars: words and numbers (``NOW``, ``strict``, ``job-7``, ``1200``), relative
  times (``+5m``, ``+1h30m``), delay-scheduling counts (``^3``) and date-times
  (``26-01-01 12:00:00``, ``2026-01-01T12:00:00Z``);
- empty array elements for open interval ends: ``[, +5m]``, ``[NOW, ]``;
- a top level without braces: ``DemandID: 1234, OrderBy: 1200``.

Nothing here knows what the keys mean. Errors are :class:`TimeLangError` with the offset,
line and column of the problem and what was expected there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rm_server.domain.errors import DomainError

# An unquoted date-time: 2- or 4-digit year, optional time, optional zone. Tried before a
# bare word, so "26-01-01 12:00:00" is one token although it contains a space and colons.
DATETIME_RE = re.compile(
    r"\d{2}(?:\d{2})?-\d{1,2}-\d{1,2}"
    r"(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?"
    r"(?:Z|z|[+-]\d{2}:?\d{2})?"
)
_BARE_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_SIGIL_RE = re.compile(r"[+^][A-Za-z0-9]*")  # +5m, ^3 (validated by timelang)
_WS = " \t\r\n"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
MAX_DEPTH = 32  # nesting limit: keeps hostile input from exhausting the stack
MAX_TEXT = 64 * 1024


class TimeLangError(DomainError):
    """A malformed or meaningless condition, with its position in the text.

    ``offset`` is 0-based; ``line`` and ``column`` are 1-based. ``expected`` says what
    would have been valid there.
    """

    def __init__(self, text: str, offset: int, expected: str, found: str = "") -> None:
        self.offset = max(0, min(offset, len(text)))
        before = text[: self.offset]
        self.line = before.count("\n") + 1
        self.column = self.offset - (before.rfind("\n") + 1) + 1
        self.expected = expected
        self.found = found
        detail = f"expected {expected}" + (f", found {found}" if found else "")
        self.message = f"line {self.line}, column {self.column} (offset {self.offset}): {detail}"
        super().__init__(self.message)


@dataclass(frozen=True)
class Scalar:
    """A leaf: ``kind`` is "string" (quoted), "bare", "datetime" or "sigil" (+5m, ^3)."""

    kind: str
    text: str
    pos: int

    def describe(self) -> str:
        return f'"{self.text}"' if self.kind == "string" else repr(self.text)


@dataclass(frozen=True)
class Empty:
    """An omitted array element (``[, +5m]``): an open interval end."""

    pos: int

    def describe(self) -> str:
        return "nothing"


@dataclass(frozen=True)
class Member:
    key: str
    key_pos: int
    value: Node


@dataclass(frozen=True)
class Obj:
    members: tuple[Member, ...]
    pos: int

    def describe(self) -> str:
        return "an object"


@dataclass(frozen=True)
class Arr:
    items: tuple[Node, ...] = field(default=())
    pos: int = 0

    def describe(self) -> str:
        return "an array"


Node = Scalar | Empty | Obj | Arr


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, expected: str, pos: int | None = None) -> TimeLangError:
        at = self.pos if pos is None else pos
        return TimeLangError(self.text, at, expected, self._found(at))

    def _found(self, at: int) -> str:
        if at >= len(self.text):
            return "the end of the text"
        for regex in (DATETIME_RE, _SIGIL_RE, _BARE_RE):
            m = regex.match(self.text, at)
            if m:
                return repr(m.group(0))
        return repr(self.text[at])

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _WS:
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def document(self) -> Obj:
        # Without braces, the top level is a list of members up to the end of the text.
        root = self.obj(0) if self.peek() == "{" else Obj(self.members("", 0), 0)
        if self.peek():
            raise self.fail("the end of the conditions")
        return root

    def value(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.fail(f"at most {MAX_DEPTH} levels of nesting")
        c = self.peek()
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.arr(depth)
        if c == '"':
            pos = self.pos
            return Scalar("string", self.string(), pos)
        return self.scalar()

    def scalar(self) -> Scalar:
        pos = self.pos
        for kind, regex in (("datetime", DATETIME_RE), ("sigil", _SIGIL_RE), ("bare", _BARE_RE)):
            m = regex.match(self.text, pos)
            if m and (kind != "datetime" or not _continues_word(self.text, m.end())):
                self.pos = m.end()
                return Scalar(kind, m.group(0), pos)
        raise self.fail("a value: an object {...}, an array [...], a time, a number or a word")

    def string(self) -> str:
        start = self.pos
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.fail('a closing " for the string', start)
            c = self.text[self.pos]
            if c == '"':
                self.pos += 1
                return "".join(out)
            if c == "\\":
                esc = self.text[self.pos + 1 : self.pos + 2]
                if esc in _ESCAPES:
                    out.append(_ESCAPES[esc])
                    self.pos += 2
                    continue
                hexdigits = self.text[self.pos + 2 : self.pos + 6]
                if esc == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", hexdigits):
                    out.append(chr(int(hexdigits, 16)))
                    self.pos += 6
                    continue
                raise self.fail('a JSON escape (\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)')
            if c < " ":
                raise self.fail("a printable character in the string (escape control characters)")
            out.append(c)
            self.pos += 1

    def key(self) -> tuple[str, int]:
        pos = self.pos
        if self.peek() == '"':
            return self.string(), pos
        m = _BARE_RE.match(self.text, self.pos)
        if not m:
            raise self.fail("a field name")
        self.pos = m.end()
        return m.group(0), pos

    def members(self, closer: str, depth: int) -> tuple[Member, ...]:
        out: list[Member] = []
        if self.peek() == closer:
            return ()
        while True:
            self.skip()
            key, key_pos = self.key()
            if self.peek() != ":":
                raise self.fail(f"':' after the field name {key!r}")
            self.pos += 1
            out.append(Member(key, key_pos, self.value(depth + 1)))
            c = self.peek()
            if c == ",":
                self.pos += 1
                continue
            if c == closer:
                return tuple(out)
            raise self.fail(f"',' or '{closer}'" if closer else "',' or the end of the text")

    def obj(self, depth: int) -> Obj:
        pos = self.pos
        self.pos += 1  # '{'
        members = self.members("}", depth)
        self.pos += 1  # '}'
        return Obj(members, pos)

    def arr(self, depth: int) -> Arr:
        pos = self.pos
        self.pos += 1  # '['
        items: list[Node] = []
        if self.peek() == "]":
            self.pos += 1
            return Arr((), pos)
        while True:
            c = self.peek()
            if c in (",", "]"):  # an omitted element: an open interval end
                items.append(Empty(self.pos))
            else:
                items.append(self.value(depth + 1))
            c = self.peek()
            if c == ",":
                self.pos += 1
                continue
            if c == "]":
                self.pos += 1
                return Arr(tuple(items), pos)
            raise self.fail("',' or ']'")


def _continues_word(text: str, end: int) -> bool:
    # "2026-01-01x" is not a date-time followed by "x": let the bare-word reader report it.
    return end < len(text) and (text[end].isalnum() or text[end] in "_.")


def read(text: str) -> Obj:
    """Parse condition text into a tree; TimeLangError with the position when malformed."""
    if len(text) > MAX_TEXT:
        raise TimeLangError(text, MAX_TEXT, f"at most {MAX_TEXT} characters of conditions")
    if not text.strip():
        raise TimeLangError(text, len(text), "an object such as {Start: {Time: [NOW, +5m]}}")
    return _Reader(text).document()
