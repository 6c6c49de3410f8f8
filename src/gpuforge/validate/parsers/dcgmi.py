"""``dcgmi diag``: the text table, or the ``-j`` JSON (DCGM 3.x layout).

The table's cells wrap at a fixed width, even mid-word; continuation rows (empty left cell) are
joined back. ``Error``, ``Warning`` and ``Info`` rows belong to the test above them. A result
cell reads ``Pass``, ``Fail - GPU: 1``, ``Pass - GPUs: 0, 2, 3`` or ``Skip - All``; ``All`` is
expanded to every GPU when the Metadata section lists the GPU device IDs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpuforge.validate.parsers._common import (
    ParseError,
    refuse_other_tool,
    require_text,
    split_lines,
)

STATUSES = ("Pass", "Fail", "Skip", "Warn")
_STATUS = re.compile(r"^(Pass|Fail|Skip|Warn)\b\s*(?:-\s*(.*))?$", re.IGNORECASE)
_SECTION = re.compile(r"^[|+]-+\s+(\S.*?)\s+-+[+|]")
_MESSAGE_ROWS = ("Error", "Warning", "Info")
_METADATA = ("DCGM Version", "Driver Version Detected", "GPU Device IDs Detected")


@dataclass(frozen=True, slots=True)
class DiagGpuResult:
    """The result of one test on one GPU; ``gpu`` is None when the tool reports no GPU."""

    gpu: int | None
    status: str


@dataclass(frozen=True, slots=True)
class DiagTest:
    """One test (``Persistence Mode``, ``Targeted Power``, ...) and its per-GPU results."""

    category: str
    name: str
    status: str
    """The worst result: Fail over Warn over Pass over Skip."""
    results: tuple[DiagGpuResult, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    info: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DcgmDiag:
    """A whole ``dcgmi diag`` run."""

    format: str
    """``table``, ``json``, or ``text`` (dcgmi printed only error lines)."""
    completed: bool
    """False when dcgmi printed an error instead of a result table."""
    dcgm_version: str | None
    driver_version: str | None
    gpu_device_ids: tuple[str, ...]
    tests: tuple[DiagTest, ...]
    errors: tuple[str, ...]
    """Errors not tied to one test: dcgmi's own error lines, or an Error row without a test."""
    warnings: tuple[str, ...]

    @property
    def failed(self) -> tuple[DiagTest, ...]:
        """Tests whose status is Fail."""
        return tuple(t for t in self.tests if t.status == "Fail")


_RANK = {"Fail": 3, "Warn": 2, "Pass": 1, "Skip": 0}


def _worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: _RANK[s]) if statuses else "Skip"


def _gpu_list(spec: str | None, gpu_count: int | None) -> list[int | None]:
    if spec is None or not spec.strip():
        return [None]
    spec = spec.strip()
    if spec.lower() == "all":
        return list(range(gpu_count)) if gpu_count else [None]
    match = re.match(r"^GPUs?\s*:?\s*(.*)$", spec)
    numbers = re.findall(r"\d+", match[1] if match else spec)
    return [int(n) for n in numbers] or [None]


@dataclass(slots=True)
class _Row:
    line: int
    name: str
    chunks: list[str]
    category: str


def _join(chunks: list[str]) -> str:
    parts = [c[1 : len(c) - 2] for c in chunks[:-1]] + [chunks[-1][1:].rstrip()]
    return re.sub(r"\s{2,}", " ", "".join(parts)).strip()


def _normal_status(word: str) -> str:
    return word[:1].upper() + word[1:].lower()


def _parse_table(lines: list[str]) -> DcgmDiag:  # noqa: PLR0912, PLR0915 - one branch per kind of line the tool prints
    rows: list[_Row] = []
    category = ""
    saw_header = False
    closed = False
    tool_errors: list[str] = []
    warnings: list[str] = []
    for lineno, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if match := _SECTION.match(stripped):
            category = match[1]
            closed = False
            continue
        if re.fullmatch(r"\+[-=+]+\+", stripped):
            closed = saw_header and stripped.startswith("+-") and not stripped.startswith("+=")
            continue
        if stripped.startswith("|"):
            cells = stripped.split("|")
            if len(cells) < 4:
                raise ParseError("table row without two cells", line=lineno, text=line)
            name, value = cells[1].strip(), "|".join(cells[2:-1])
            if name == "Diagnostic" and value.strip() == "Result":
                saw_header = True
                continue
            if not saw_header:
                raise ParseError("table row before the 'Diagnostic | Result' header", line=lineno)
            closed = False
            if name:
                rows.append(_Row(line=lineno, name=name, chunks=[value], category=category))
            elif rows:
                rows[-1].chunks.append(value)
            else:
                raise ParseError("continuation row without a row above it", line=lineno, text=line)
            continue
        if stripped.startswith("Error") or "incompatible" in stripped or "Unable" in stripped:
            tool_errors.append(stripped)
            continue
        if stripped.startswith("Successfully ran diagnostic"):
            continue
        if saw_header:
            raise ParseError("not a 'dcgmi diag' table line", line=lineno, text=line)
        # Text before the table (a pasted command line, shell prompts): skipped.
    if not saw_header and not tool_errors:
        raise ParseError("no 'dcgmi diag' table and no dcgmi error message found")
    if saw_header and not closed:
        warnings.append("the table is not closed by a '+---+' border: the output is cut")
    metadata: dict[str, str] = {}
    tests: list[dict[str, Any]] = []
    for row in rows:
        if row.name in _METADATA:
            metadata[row.name] = _join(row.chunks)
            continue
        if row.name in _MESSAGE_ROWS:
            message = _join(row.chunks)
            if tests and tests[-1]["category"] == row.category:
                tests[-1][row.name].append(message)
            elif row.name == "Error":
                tool_errors.append(message)
            else:
                warnings.append(f"line {row.line}: {row.name} row without a test: {message}")
            continue
        tests.append(
            {
                "category": row.category,
                "name": row.name,
                "row": row,
                "Error": [],
                "Warning": [],
                "Info": [],
            }
        )
    device_ids = tuple(
        d.strip() for d in metadata.get("GPU Device IDs Detected", "").split(",") if d.strip()
    )
    gpu_count = len(device_ids) or None
    built = []
    for test in tests:
        row = test["row"]
        results: list[DiagGpuResult] = []
        for chunk in row.chunks:
            clause = chunk.strip()
            match = _STATUS.match(clause)
            if match is None:
                raise ParseError(
                    f"result of {row.name!r} is not Pass/Fail/Skip/Warn", line=row.line, text=clause
                )
            status = _normal_status(match[1])
            results.extend(
                DiagGpuResult(gpu=g, status=status) for g in _gpu_list(match[2], gpu_count)
            )
        built.append(
            DiagTest(
                category=test["category"],
                name=test["name"],
                status=_worst([r.status for r in results]),
                results=tuple(results),
                errors=tuple(test["Error"]),
                warnings=tuple(test["Warning"]),
                info=tuple(test["Info"]),
            )
        )
    return DcgmDiag(
        format="table" if saw_header else "text",
        completed=saw_header,
        dcgm_version=metadata.get("DCGM Version"),
        driver_version=metadata.get("Driver Version Detected"),
        gpu_device_ids=device_ids,
        tests=tuple(built),
        errors=tuple(dict.fromkeys(tool_errors)),
        warnings=tuple(warnings),
    )


def _messages(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        out: list[str] = []
        for item in value:
            if isinstance(item, dict):
                text = item.get("warning") or item.get("info") or item.get("error") or ""
                out.append(str(text))
            else:
                out.append(str(item))
        return tuple(out)
    return (str(value),)


def _parse_json(text: str) -> DcgmDiag:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    body = None
    if isinstance(data, dict):
        body = data.get("DCGM GPU Diagnostic") or data.get("DCGM Diagnostic")
    if not isinstance(body, dict) or not isinstance(body.get("test_categories"), list):
        raise ParseError("JSON without 'DCGM GPU Diagnostic' → 'test_categories'", line=1)
    tests = []
    for category in body["test_categories"]:
        for test in category.get("tests", []):
            results: list[DiagGpuResult] = []
            errors: list[str] = []
            warnings: list[str] = []
            info: list[str] = []
            for result in test.get("results", []):
                status = _normal_status(str(result.get("status", "")))
                if status not in STATUSES:
                    raise ParseError(f"test {test.get('name')!r} has status {status!r}")
                ids = result.get("gpu_ids", result.get("gpu_id"))
                gpus = _gpu_list(str(ids), None) if ids is not None else [None]
                results.extend(DiagGpuResult(gpu=g, status=status) for g in gpus)
                errors.extend(_messages(result.get("error")))
                warnings.extend(_messages(result.get("warnings")))
                info.extend(_messages(result.get("info")))
            tests.append(
                DiagTest(
                    category=str(category.get("category", "")),
                    name=str(test.get("name", "")),
                    status=_worst([r.status for r in results]),
                    results=tuple(results),
                    errors=tuple(errors),
                    warnings=tuple(warnings),
                    info=tuple(info),
                )
            )
    if not tests:
        raise ParseError("JSON holds no tests")
    version = body.get("version") or data.get("version")
    driver = data.get("Driver Version Detected") or body.get("Driver Version Detected")
    return DcgmDiag(
        format="json",
        completed=True,
        dcgm_version=str(version) if version else None,
        driver_version=str(driver) if driver else None,
        gpu_device_ids=tuple(str(d) for d in data.get("GPU Device IDs", [])),
        tests=tuple(tests),
        errors=(),
        warnings=(),
    )


def parse(text: str) -> DcgmDiag:
    """Parse ``dcgmi diag`` output, table or ``-j`` JSON."""
    require_text(text, "dcgmi diag")
    refuse_other_tool(text, "dcgmi diag")
    if text.lstrip().startswith("{"):
        return _parse_json(text)
    return _parse_table(split_lines(text))
