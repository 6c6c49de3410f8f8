"""Records in the health record format (``gpuforge.record/1``) for the history and health tests."""

from __future__ import annotations

from typing import Any

from gpuforge.history.store import iso

T0 = 1_795_000_000.0  # 2026-11-18: an epoch second inside the project's test calendar


def record(
    node: str = "gpu01",
    *,
    at: float = T0,
    tier: str = "passive",
    verdict: str = "pass",
    failed: tuple[tuple[str, str], ...] = (),
    status: str = "fail",
    counters: dict[str, int] | None = None,
    events: list[dict[str, Any]] | None = None,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One record; ``failed`` lists (check, action) pairs reported with ``status``."""
    checks: list[dict[str, Any]] = [
        {"check": "gpu.count", "status": "pass", "action": None, "measured": 8, "expected": 8,
         "detail": "", "evidence": "", "shadow": False, "streak": 0},
    ]  # fmt: skip
    for check, action in failed:
        checks.append(
            {"check": check, "status": status, "action": action, "measured": "x",
             "expected": "y", "detail": "", "evidence": "79@PCI:0000:91:00", "shadow": False,
             "streak": 1}
        )  # fmt: skip
    return {
        "schema": "gpuforge.record/1",
        "node": node,
        "tier": tier,
        "level": None,
        "started": iso(at),
        "duration_s": 1.8,
        "job_id": None,
        "config_digest": "sha256:0",
        "verdict": verdict,
        "checks": checks,
        "counters": counters if counters is not None else {"ib/mlx5_0/1/symbol_error": 0},
        "events": events or [],
        "drift": [],
        "request": request,
    }
