"""Fake deploy steps: a scripted cluster where some nodes fail preflight, provisioning or checks."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuforge.playbook import run_playbook
from gpuforge.rollout.deploy import ValidationOutcome
from gpuforge.rollout.state import ResultRow
from gpuforge.slurm.control import NodeAction
from gpuforge.validate.result import NodeVerdict, Verdict


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

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> ValidationOutcome:
        self.calls.append(("validate", tuple(hosts)))
        time.sleep(self.delay_s)
        verdicts = {
            h: NodeVerdict(h, Verdict.QUARANTINE, (self.faulty[h],))
            if h in self.faulty
            else NodeVerdict(h, Verdict.ADMIT)
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
        return ValidationOutcome(verdicts, results)

    def admit(self, verdicts: list[NodeVerdict]) -> list[NodeAction]:
        admitted = [v.node for v in verdicts if v.verdict is Verdict.ADMIT]
        self.calls.append(("admit", tuple(admitted)))
        out = []
        for v in verdicts:
            if v.verdict is Verdict.ADMIT:
                self.slurm[v.node] = "resumed"
                out.append(NodeAction(v.node, "resume", True, after="IDLE"))
            elif v.verdict is Verdict.QUARANTINE:
                self.slurm[v.node] = f"drained: {'; '.join(v.reasons)}"
                out.append(NodeAction(v.node, "drain", True, after="IDLE+DRAIN"))
        return out


#: Stands in for ansible-playbook: forks a worker (as Ansible does), records both pids and notes
#: when another play is still running beside it, then exits 0 after ``FAKE_PLAY_S`` seconds.
FAKE_PLAYBOOK = """\
import os, sys, time
out = os.environ["FAKE_PLAY_DIR"]
me = os.getpid()
for name in os.listdir(out):
    if name.startswith("running-"):
        other = int(name.split("-")[1])
        try:
            state = open(f"/proc/{other}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            open(os.path.join(out, f"overlap-{other}-{me}"), "w").close()
open(os.path.join(out, f"running-{me}"), "w").close()
worker = os.fork()
if worker == 0:
    time.sleep(60)
    os._exit(0)
open(os.path.join(out, f"worker-{worker}"), "w").close()
time.sleep(float(os.environ.get("FAKE_PLAY_S", "0.5")))
os.kill(worker, 9)
os.waitpid(worker, 0)
os.unlink(os.path.join(out, f"running-{me}"))
print("PLAY RECAP")
"""


def install_fake_playbook(bin_dir: Path) -> Path:
    """Write an ``ansible-playbook`` that runs :data:`FAKE_PLAYBOOK` into ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "ansible-playbook"
    script.write_text(f"#!{sys.executable}\n{FAKE_PLAYBOOK}")
    script.chmod(0o755)
    return script


@dataclass
class PlaySteps(FakeSteps):
    """Fake steps whose provisioning runs a (fake) play through the real playbook facade."""

    inventory: Path = Path("/nonexistent")
    play_record: Path | None = None

    def provision(self, hosts: list[str]) -> dict[str, str]:
        self.calls.append(("provision", tuple(hosts)))
        run_playbook("site.yml", self.inventory, play_record=self.play_record, timeout_s=60)
        return {h: "install driver: no such version" for h in hosts if h in self.broken_provision}
