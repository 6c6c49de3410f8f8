"""Spec errors: every problem names the file, the field path and, when known, the line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuforge.errors import InputError

MAX_MESSAGE = 300
"""Characters of one problem's message: a value quoted in a message may be huge."""
MAX_PROBLEMS = 50
"""Problems listed in one error; the rest are counted."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a spec: ``path`` is a dotted field path such as ``fabric.radix``."""

    path: str
    message: str
    line: int | None = None

    def render(self, file: Path | str | None) -> str:
        where = str(file) if file is not None else "<spec>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        field = _clip(self.path or "(top level)", 200)
        return f"{where}: {field}: {_clip(self.message, MAX_MESSAGE)}"


class SpecError(InputError):
    """A topology spec is invalid; ``problems`` lists every problem found (exit code 2)."""

    def __init__(self, problems: list[Problem], file: Path | str | None = None) -> None:
        self.problems = tuple(problems)
        self.file = file
        super().__init__(self._format())

    def _format(self) -> str:
        lines = [p.render(self.file) for p in self.problems[:MAX_PROBLEMS]]
        if len(self.problems) == 1:
            return lines[0]
        count = len(self.problems)
        head = f"{count} problems in {self.file if self.file is not None else 'the spec'}:"
        more = [f"  ... and {count - MAX_PROBLEMS} more"] if count > MAX_PROBLEMS else []
        return "\n".join([head, *(f"  {line}" for line in lines), *more])

    def with_file(self, file: Path | str, lines: dict[str, int] | None = None) -> SpecError:
        """Return a copy that names ``file`` and fills in lines from ``lines`` (path -> line)."""
        lines = lines or {}
        fixed = [
            p if p.line is not None else Problem(p.path, p.message, _line_for(p.path, lines))
            for p in self.problems
        ]
        return SpecError(fixed, file)


def _line_for(path: str, lines: dict[str, int]) -> int | None:
    """The line of ``path`` or of its nearest ancestor present in the YAML."""
    probe = path
    while probe:
        if probe in lines:
            return lines[probe]
        cut = max(probe.rfind("."), probe.rfind("["))
        if cut <= 0:
            break
        probe = probe[:cut]
    return lines.get(probe)
