"""Control characters in text one party writes and another reads: the one definition
the RM refuses free text by (rm_server/domain/text.py) and rmctl and the web console
render stored text with.

A control character in a reason, a name or a log line is an instruction to whatever
shows it: ESC starts terminal sequences (``ESC ] 0 ; title BEL`` sets a window title,
``ESC [ 2 J`` clears the screen, others rewrite what is on it or, on some terminals,
answer back into its input), a carriage return or a backspace overwrites what came
before, and the Unicode bidirectional controls reorder what a page or terminal shows
("Trojan Source: Invisible Vulnerabilities", Boucher and Anderson, 2021). Shown to
someone, each is written out instead (``\\x1b``, ``\\u202e``): visible, never obeyed.
"""

from __future__ import annotations

import re

__all__ = ["CONTROL_CHARACTERS", "first_control", "visible"]

# C0 controls, DEL, C1 controls (U+0080-U+009F: 8-bit CSI and OSC among them), the
# Arabic letter mark, the left-to-right and right-to-left marks, the line and paragraph
# separators, and the bidirectional embeddings, overrides and isolates.
CONTROL_CHARACTERS = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
_CONTROL_RE = re.compile(f"[{CONTROL_CHARACTERS}]")


def first_control(text: str, allowed: str = "") -> int | None:
    """The offset of the first control character in `text` that `allowed` does not
    list (for example ``"\\n\\t"``), or None when there is none."""
    for found in _CONTROL_RE.finditer(text):
        if found.group() not in allowed:
            return found.start()
    return None


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, keep: str = "") -> str:
    """`text` with every control character but those in `keep` written out as an
    escape (``\\x1b``, ``\\u202e``); text without any is returned as it is."""
    if _CONTROL_RE.search(text) is None:
        return text
    return _CONTROL_RE.sub(lambda m: m.group() if m.group() in keep else _escaped(m.group()), text)
