"""A drifted file's unified diff against the content its role rendered (standard library only).

The desired-state record a role writes (``roles/_common/library/gpuforge_expected_state.py``)
keeps, beside each file's sha256, the file's content as the role left it (``content``: at most
:data:`CONTENT_MAX_BYTES` per file, cut files noted, never for a file that can hold a secret).
When a file's digest drifts, :func:`file_diff` reads that content back and diffs it with what the
node holds now, so an operator sees what changed, not two sums. The diff is bounded
(:data:`DIFF_MAX_CHARS`): it goes into the ``conformance.drift`` check's evidence, which the
record clips anyway.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

#: Bytes of a file's content a desired-state record keeps (the rest is cut, and noted).
CONTENT_MAX_BYTES = 64 * 1024
#: Characters of one file's diff carried into the evidence.
DIFF_MAX_CHARS = 1500
#: Lines of context around each change.
CONTEXT_LINES = 2
#: Starts every diff in the evidence (the controller finds the diffs by it).
DIFF_HEADER = "--- "


def _recorded(expected_path: Path, path: str) -> tuple[str | None, str]:
    """The content ``expected_path`` recorded for ``path`` and a note when there is none."""
    try:
        data = json.loads(expected_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"(no diff: {expected_path}: {exc})"
    entry = (data.get("content") or {}).get(path) if isinstance(data, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
        why = entry.get("omitted") if isinstance(entry, dict) else None
        return None, f"(no diff for {path}: {why or 'its rendered content is not recorded'})"
    return entry["text"], "cut" if entry.get("truncated") else ""


def bounded_diff(
    path: str, desired: str, actual: str, *, cut: bool = False, limit: int = DIFF_MAX_CHARS
) -> str:
    """The unified diff of ``desired`` (rendered) to ``actual`` (on the node), at most ``limit``
    characters; says when the rendered content was cut or the diff is."""
    if cut:
        # Only the first CONTENT_MAX_BYTES were kept: compare the same head of the file.
        actual = actual[: len(desired)]
    lines = list(
        difflib.unified_diff(
            desired.splitlines(),
            actual.splitlines(),
            f"{path} (rendered by the role)",
            f"{path} (on the node)",
            n=CONTEXT_LINES,
            lineterm="",
        )
    )
    notes: list[str] = []
    if cut:
        notes.append(f"(rendered content cut at {CONTENT_MAX_BYTES} bytes: the head is compared)")
    if not lines:
        notes.append("(same lines: the bytes differ in line ends, or past the cut)")
        return "\n".join([f"{DIFF_HEADER}{path}", *notes])
    text = "\n".join(lines)
    if len(text) > limit:
        text = text[:limit].rsplit("\n", 1)[0] + f"\n(... diff cut at {limit} characters)"
    return "\n".join([text, *notes])


def file_diff(expected_path: Path, path: str, read_text: Callable[[str], str | None]) -> str:
    """The diff of drifted ``path`` against the content ``expected_path`` recorded; a one-line
    note when it cannot be shown (not recorded, a secret, the file missing or unreadable)."""
    desired, note = _recorded(expected_path, path)
    if desired is None:
        return note
    try:
        actual = read_text(path)
    except (OSError, RuntimeError) as exc:  # the node's ProbeError is a RuntimeError
        return f"(no diff for {path}: {exc})"
    if actual is None:
        return f"(no diff for {path}: the file is missing)"
    return bounded_diff(path, desired, actual, cut=note == "cut")


def with_diffs(evidence: str, diffs: Sequence[str]) -> str:
    """``evidence`` followed by each file's diff (a blank line between them)."""
    return "\n\n".join([evidence, *diffs]) if diffs else evidence
