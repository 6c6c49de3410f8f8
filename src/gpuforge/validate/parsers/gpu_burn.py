"""gpu-burn output: per-GPU verdicts (``OK`` / ``FAULTY``), error counts, Gflop/s, temperatures.

gpu-burn exits 0 even when GPUs are FAULTY, so the verdict comes from the ``Tested N GPUs:``
summary, never from the exit code. Progress records (``50.0%  proc'd: ... errors: ... temps:``)
are often concatenated on one line (``\\r`` lost in logs); the last one gives each GPU's final
error count, Gflop/s and temperature. A log without the summary is incomplete, not a pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuforge.validate.parsers._common import ParseError, require_text, split_lines

_PROGRESS = re.compile(r"(\d+(?:\.\d+)?)%\s+proc'd:")
_PROC = re.compile(r"(-?\d+)\s+\((-?\d+(?:\.\d+)?)\s+Gflop/s\)")
_ERRORS = re.compile(r"(-?\d+)\s*(\(WARNING!\))?")
_TEMPS = re.compile(r"(-?\d+)\s*C\b")
_TESTED = re.compile(r"^Tested\s+(\d+)\s+GPUs:\s*$")
_VERDICT = re.compile(r"^GPU\s+(\d+):\s+(OK|FAULTY)\b")
_LISTED = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*([^)]*)\)\s*$")
_INIT = re.compile(r"^Initialized device (\d+) with (\d+) MB")


@dataclass(frozen=True, slots=True)
class BurnGpu:
    """One GPU's outcome."""

    index: int
    verdict: str | None
    """``OK`` or ``FAULTY``; None when the run did not reach the summary."""
    errors: int | None
    """Errors in the last progress record; negative values (counter overflow) are kept as is."""
    error_warning: bool
    """gpu-burn flagged the error count with ``(WARNING!)``."""
    gflops: float | None
    iterations: int | None
    temperature_c: int | None
    name: str | None
    uuid: str | None


@dataclass(frozen=True, slots=True)
class GpuBurnResult:
    """A gpu-burn run."""

    complete: bool
    """True when the ``Tested N GPUs:`` summary is present."""
    tested: int | None
    gpus: tuple[BurnGpu, ...]
    progress_records: int
    last_progress_percent: float | None
    warnings: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """Complete, every GPU OK and no error counted."""
        return (
            self.complete
            and bool(self.gpus)
            and all(g.verdict == "OK" and not g.errors for g in self.gpus)
        )


def _last_progress(text: str) -> tuple[int, float | None, dict[str, list[tuple[str, ...]]]]:
    chunks = _PROGRESS.split(text)
    # split() gives [before, pct1, body1, pct2, body2, ...]
    count = (len(chunks) - 1) // 2
    if count == 0:
        return 0, None, {}
    percent, body = float(chunks[-2]), chunks[-1].split("\n", 1)[0]
    proc_part, _, rest = body.partition("errors:")
    errors_part, _, temps_part = rest.partition("temps:")
    return (
        count,
        percent,
        {
            "proc": _PROC.findall(proc_part),
            "errors": _ERRORS.findall(errors_part),
            "temps": [(t,) for t in _TEMPS.findall(temps_part)],
        },
    )


def parse(text: str) -> GpuBurnResult:
    """Parse a gpu-burn log; raise ParseError when it has neither progress nor a summary."""
    require_text(text, "gpu-burn")
    lines = split_lines(text)
    tested: int | None = None
    verdicts: dict[int, str] = {}
    listed: dict[int, tuple[str, str]] = {}
    warnings: list[str] = []
    in_summary = False
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if match := _TESTED.match(line):
            tested = int(match[1])
            in_summary = True
            verdicts = {}
            continue
        if in_summary and (match := _VERDICT.match(line)):
            verdicts[int(match[1])] = match[2]
            continue
        if in_summary and line:
            in_summary = False
        if match := _LISTED.match(line):
            listed[int(match[1])] = (match[2], match[3])
            continue
        if line.startswith(("Couldn't init", "Error", "Failure", "CUDA error")):
            warnings.append(f"line {lineno}: {line}")
    count, percent, last = _last_progress(text)
    if tested is None and count == 0:
        raise ParseError("neither gpu-burn progress ('proc'd:') nor a 'Tested N GPUs:' summary")
    proc = last.get("proc", [])
    errors = last.get("errors", [])
    temps = last.get("temps", [])
    if count and not (len(proc) == len(errors) == len(temps)):
        warnings.append(
            f"last progress record lists {len(proc)} GPUs' Gflop/s, {len(errors)} error counts "
            f"and {len(temps)} temperatures"
        )
    if tested is None:
        warnings.append("no 'Tested N GPUs:' summary: the run did not finish (killed or crashed)")
    elif len(verdicts) != tested:
        warnings.append(f"'Tested {tested} GPUs:' but {len(verdicts)} verdict line(s)")
    indices = sorted(set(verdicts) | set(range(max(len(proc), len(errors)))) | set(listed))
    gpus = []
    for index in indices:
        name, uuid = listed.get(index, (None, None))
        gpus.append(
            BurnGpu(
                index=index,
                verdict=verdicts.get(index),
                errors=int(errors[index][0]) if index < len(errors) else None,
                error_warning=bool(errors[index][1]) if index < len(errors) else False,
                gflops=float(proc[index][1]) if index < len(proc) else None,
                iterations=int(proc[index][0]) if index < len(proc) else None,
                temperature_c=int(temps[index][0]) if index < len(temps) else None,
                name=name,
                uuid=uuid,
            )
        )
    return GpuBurnResult(
        complete=tested is not None,
        tested=tested,
        gpus=tuple(gpus),
        progress_records=count,
        last_progress_percent=percent,
        warnings=tuple(warnings),
    )
