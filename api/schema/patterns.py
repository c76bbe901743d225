r"""The protocol's patterns for JSON Schema: anchored, and read alike by every validator.

The protocol uses fullmatch; JSON Schema's `pattern` searches, so each is anchored. `\x00` and
the classes below read the same in ECMA 262, Python and the Rust engine schemathesis validates
with; `\s` does not, so the whitespace that `str.isspace` knows is spelled out.
"""

from __future__ import annotations

import re
import sys

import sluice_protocol as p


def _anchored(regex: re.Pattern[str]) -> str:
    return f"^{regex.pattern}$"


def _python_whitespace_class() -> str:
    spaces = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    runs: list[tuple[int, int]] = []
    for c in spaces:
        if runs and runs[-1][1] == c - 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return "".join(f"\\u{lo:04x}" if lo == hi else f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in runs)


def _decimal_up_to(high: int) -> str:
    """An anchored pattern for the decimals 1..high without leading zeros (high >= 10)."""
    digits = str(high)
    alternatives = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"]
    for index, char in enumerate(digits):
        low = 1 if index == 0 else 0
        if int(char) > low:
            rest = len(digits) - index - 1
            alternatives.append(f"{digits[:index]}[{low}-{int(char) - 1}][0-9]{{{rest}}}")
    alternatives.append(digits)
    return "^(?:" + "|".join(alternatives) + ")$"


# A safe relative path (§2.2): segments of anything but "/", "\" and NUL, none of them "." or "..".
_SEGMENT = r"[^/\\\x00]+"
_NO_DOT_SEGMENTS = r"(?!\.\.?(?:/|$))(?![^\x00]*/\.\.?(?:/|$))"
_SAFE_PATH = f"{_NO_DOT_SEGMENTS}{_SEGMENT}(?:/{_SEGMENT})*"
_WHITESPACE = _python_whitespace_class()

PATTERNS: dict[str, str] = {
    "workerId": _anchored(p._NAME_RE),
    "workspaceId": _anchored(p._WORKSPACE_ID_RE),
    "requestId": _anchored(p._REQUEST_ID_RE),
    "sha256": _anchored(p._SHA256_HEX_RE),
    "signal": _anchored(p._SIGNAL_RE),
    "unavailable": _anchored(p._UNAVAILABLE_RE),
    "timeout": _anchored(p._TIMEOUT_RE),
    # git refuses a worktree named *.lock; the name's characters cannot include a newline.
    "worktree": f"^(?!.*\\.lock$){p._NAME_RE.pattern}$",
    # The contract's ^[1-9][0-9]*$ and <= MAX_QUEUE_WAIT_MS, as one pattern.
    "queueWaitMs": _decimal_up_to(p.MAX_QUEUE_WAIT_MS),
    "path": f"^{_SAFE_PATH}$",
    "pathOrRoot": f"^(?:{_SAFE_PATH})?$",
    "query": "^[^\\x00\\r\\n]*$",
    # Not blank (str.isspace) and no NUL: optional whitespace, one other character, then any.
    "command": f"^[{_WHITESPACE}]*[^{_WHITESPACE}\\x00][^\\x00]*$",
    "incarnationId": "^[0-9a-f]{32}$",
    "seconds": "^[1-9][0-9]*$",
    "count": "^[0-9]+$",
}
