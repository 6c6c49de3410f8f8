"""Fake deploy steps: a scripted cluster where some nodes fail preflight, provisioning or checks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpuforge.rollout.deploy import NodeVerdict, Validation
from gpuforge.rollout.state import ResultRow


@dataclass
class FakeSteps:
    unreachable: set[str] = field(default_factory=set)
    broken_provision: set[str] = field(default_factory=set)
    faulty: dict[str, str] = field(default_factory=dict)  # host -> failed check
    delay_s: float = 0.0
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    slurm: dict[str, str] = field(default_factory=dict)  # host -> "resumed" | "drained: reason"

    def preflight(self, hosts: list[str]) -> dict[str, str]:
        self.calls.append(("preflight", tuple(hosts)))
        time.sleep(self.delay_s)
        return {h: "ssh: connection refused" for h in hosts if h in self.unreachable}

    def provision(self, hosts: list[str]) -> dict[str, str]:
        self.calls.append(("provision", tuple(hosts)))
        time.sleep(self.delay_s)
        return {h: "install driver: no such version" for h in hosts if h in self.broken_provision}

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> Validation:
        self.calls.append(("validate", tuple(hosts)))
        time.sleep(self.delay_s)
        verdicts = {
            h: NodeVerdict(h, h not in self.faulty, (self.faulty[h],) if h in self.faulty else ())
            for h in hosts
        }
        results = tuple(
            ResultRow(
                h,
                self.faulty.get(h, "gpu_count"),
                "fail" if h in self.faulty else "pass",
                "7" if h in self.faulty else "8",
                "8",
                "",
                0.1,
            )
            for h in hosts
        )
        return Validation(verdicts, results)

    def admit(self, admitted: list[str], quarantined: dict[str, str]) -> None:
        self.calls.append(("admit", tuple(admitted)))
        for h in admitted:
            self.slurm[h] = "resumed"
        for h, why in quarantined.items():
            self.slurm[h] = f"drained: {why}"
