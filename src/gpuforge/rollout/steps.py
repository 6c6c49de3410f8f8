"""The real deploy steps: Ansible preflight and provisioning, the validators, Slurm admission."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuforge.admission import Admission
from gpuforge.inventory.reader import InventoryDir, host_vars
from gpuforge.playbook import EventHandler, RunResult, run_playbook
from gpuforge.rollout.deploy import Validation
from gpuforge.slurm.control import NodeAction, SlurmClient
from gpuforge.validate.result import NodeVerdict

ValidateFn = Callable[[list[str], str, list[str]], Validation]


def controller_client(inventory: Path, controller: str) -> SlurmClient:
    """Run Slurm commands on ``controller`` over SSH with the inventory's connection settings."""
    return SlurmClient.over_ssh(controller, host_vars(inventory, controller))


@dataclass
class AnsibleSteps:
    """Steps of a deploy against real (or lab) nodes reached through ``inventory``."""

    inventory: Path  # the cluster directory: its generated and site layers
    artifacts: Path  # ansible-runner event logs, one folder per play
    validate_fn: ValidateFn
    admission: Admission
    #: Maintenance reservation the batch is validated in (closed to users, open to acceptance jobs).
    reservation: str = "gpuforge_validation"
    #: Admitted, idle nodes taken into the window as known-good partners (burnin and full).
    partners: int = 2
    on_event: EventHandler | None = None
    #: Where the running play's process group is recorded (beside the cluster lock).
    play_record: Path | None = None
    runs: dict[str, RunResult] = field(default_factory=dict)

    def _play(self, name: str, playbook: str, hosts: list[str]) -> RunResult:
        result = run_playbook(
            playbook,
            InventoryDir.open(self.inventory).sources,
            limit=",".join(hosts),
            artifact_dir=self.artifacts / name,
            on_event=self.on_event,
            play_record=self.play_record,
        )
        self.runs[name] = result
        return result

    def preflight(self, hosts: list[str]) -> dict[str, str]:
        result = self._play("preflight", "preflight.yml", hosts)
        problems = {h: f"unreachable: {m}" for h, m in result.unreachable.items()}
        problems.update({h: f"preflight: {m}" for h, m in result.failed.items()})
        silent = sorted(set(hosts) - set(result.hosts) - set(problems))
        problems.update(dict.fromkeys(silent, "preflight: the play never reached this host"))
        return problems

    def provision(self, hosts: list[str]) -> dict[str, str]:
        result = self._play("provision", "site.yml", hosts)
        failed = dict(result.failed)
        for host, message in result.unreachable.items():
            failed[host] = f"unreachable during provisioning: {message}"
        if result.status not in ("successful", "failed"):
            failed.update(
                {h: f"play {result.status} (rc {result.rc})" for h in hosts if h not in failed}
            )
        return failed

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> Validation:
        # New nodes join drained, and srun starts nothing on a drained node: the batch is
        # resumed inside a root-only maintenance window for the acceptance jobs, with a few
        # idle admitted nodes as known-good partners. The window is recorded before Slurm is
        # touched; admit() closes it, and so does the next run after a kill.
        partners = (
            [] if level == "quick" else self.admission.idle_in_service(admitted, self.partners)
        )
        self.admission.open_window(self.reservation, [*hosts, *partners])
        try:
            return self.validate_fn(hosts, level, partners)
        except BaseException:
            self.admission.close_window(self.reservation)
            raise

    def admit(self, verdicts: list[NodeVerdict]) -> list[NodeAction]:
        try:
            return self.admission.admit(verdicts, window=self.reservation)
        finally:
            self.admission.close_window(self.reservation)  # admitted nodes open to users
