"""What every parser shares: the error type, JSON conversion and small text helpers."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from gpuforge.errors import InputError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_EXCERPT_CHARS = 80
_MESSAGE_CHARS = 300


class ParseError(InputError):
    """Text a parser cannot read; ``line`` is 1-based, or None when no single line is to blame."""

    def __init__(self, message: str, *, line: int | None = None, text: str | None = None) -> None:
        if len(message) > _MESSAGE_CHARS:  # a reason may quote a whole (huge) line
            message = message[: _MESSAGE_CHARS - 3] + "..."
        self.reason = message
        self.line = line
        where = f"line {line}: " if line is not None else ""
        shown = ""
        if text is not None and text.strip():
            snippet = text.strip()
            if len(snippet) > _EXCERPT_CHARS:
                snippet = snippet[:_EXCERPT_CHARS] + "..."
            shown = f" (got {snippet!r})"
        super().__init__(f"{where}{message}{shown}")


def to_jsonable(value: Any) -> Any:
    """Convert a parser result (nested frozen dataclasses, tuples, dicts) into JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def split_lines(text: str) -> list[str]:
    """Lines without their endings (CRLF and LF alike) and without ANSI escape sequences."""
    return [_ANSI.sub("", line) for line in text.splitlines()]


def require_text(text: str, what: str) -> None:
    """Refuse empty or whitespace-only input with an error naming the expected tool output."""
    if not text.strip():
        raise ParseError(f"empty input: expected {what} output")


def to_int(token: str, *, line: int, text: str, what: str) -> int:
    """``int(token)`` or a ParseError naming the line."""
    try:
        return int(token, 0) if token.lower().startswith("0x") else int(token)
    except ValueError:
        raise ParseError(f"{what} is not an integer: {token!r}", line=line, text=text) from None


def to_float(token: str, *, line: int, text: str, what: str) -> float:
    """``float(token)`` or a ParseError naming the line."""
    try:
        return float(token)
    except ValueError:
        raise ParseError(f"{what} is not a number: {token!r}", line=line, text=text) from None


# Lines that only one tool prints, to tell a capture of another tool from a cut or odd one.
_SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("nvidia-smi -q", re.compile(r"^=+NVSMI LOG=+$|^Attached GPUs\s*:", re.MULTILINE)),
    (
        "nvidia-smi nvlink",
        re.compile(
            r"^GPU \d+: .*\(UUID: [^)]*\)\n(?:\s+Link \d+: |NVML: Unable to retrieve NVLink)",
            re.MULTILINE,
        ),
    ),
    ("dcgmi nvlink", re.compile(r"^\|\s*NvLink Link Status\s*\||^\s*gpuId \d+:\s*$", re.MULTILINE)),
    ("dcgmi diag", re.compile(r"^\|\s*Diagnostic\s*\|\s*Result\s*\|", re.MULTILINE)),
    ("ibv_devinfo", re.compile(r"^hca_id:\s*\S+", re.MULTILINE)),
    ("ibstat", re.compile(r"^CA '[^']+'\s*$", re.MULTILINE)),
    (
        "nvidia-smi topo -m",
        re.compile(r"^\s*GPU0(?:\s+GPU\d+)*\s+(?:NIC0\s+)?CPU Affinity", re.MULTILINE),
    ),
)


def refuse_other_tool(text: str, expected: str) -> None:
    """Raise ParseError when ``text`` is empty or carries a line only another tool prints."""
    require_text(text, expected)
    probe = "\n".join(split_lines(text[:200_000]))
    for tool, signature in _SIGNATURES:
        if tool != expected and (match := signature.search(probe)):
            line = probe.count("\n", 0, match.start()) + 1
            raise ParseError(f"this is '{tool}' output, not '{expected}'", line=line, text=match[0])
