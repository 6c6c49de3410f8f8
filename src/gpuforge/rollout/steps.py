"""The real deploy steps: Ansible preflight and provisioning, the validators, Slurm admission."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuforge import reach
from gpuforge.admission import Admission, ValidationWindow
from gpuforge.errors import InputError
from gpuforge.execution.executors import ExecutionPlan
from gpuforge.execution.plays import ProjectInput, plan_for, run_play
from gpuforge.inventory.reader import list_inventory
from gpuforge.node import bundle
from gpuforge.playbook import EventHandler, RunResult
from gpuforge.rollout.deploy import ValidationOutcome
from gpuforge.rollout.lock import play_record
from gpuforge.rollout.state import StateStore
from gpuforge.rollout.validation import validate_with_validators
from gpuforge.slurm.control import NodeAction
from gpuforge.validate.pipeline import PEER_CHECKS
from gpuforge.validate.result import NodeVerdict

ValidateFn = Callable[[list[str], str, list[str]], ValidationOutcome]

PREFLIGHT_ROUND_S = 120
"""Preflight of one round of ``forks`` nodes: a few read-only tasks."""
PROVISION_ROUND_S = 3600
"""Provisioning of one round of ``forks`` nodes: packages, a driver build, a reboot at most."""
#: What site.yml needs built on this machine when it runs on execution hosts: the health role's
#: node checker.
SITE_INPUTS = (ProjectInput(bundle.ROLE_VAR, bundle.ship),)


@dataclass(frozen=True, slots=True)
class PlayTimeout:
    """ansible-runner's whole-run limit, scaled with the batch: rounds of ``forks`` hosts."""

    forks: int = 16
    fixed_s: int = 600
    override_s: int | None = None

    @classmethod
    def from_env(cls) -> PlayTimeout:
        """``GPUFORGE_PLAY_TIMEOUT_S`` (one limit for every play) and ``GPUFORGE_FORKS``."""
        raw = os.environ.get("GPUFORGE_PLAY_TIMEOUT_S")
        forks = os.environ.get("GPUFORGE_FORKS", "16")
        try:
            override = int(raw) if raw else None
            return cls(forks=max(1, int(forks)), override_s=override)
        except ValueError:
            raise InputError(
                f"GPUFORGE_PLAY_TIMEOUT_S={raw!r} / GPUFORGE_FORKS={forks!r}: not whole numbers"
            ) from None

    def for_batch(self, hosts: int, per_round_s: int) -> int:
        """Seconds the play on ``hosts`` hosts may run in all."""
        if self.override_s is not None:
            return self.override_s
        return self.fixed_s + per_round_s * max(1, math.ceil(hosts / self.forks))


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

    #: The whole-run limit of a play: a fixed part plus one per round of ``forks`` hosts.
    #: ``GPUFORGE_PLAY_TIMEOUT_S`` replaces it with one number.
    play_timeout: PlayTimeout = field(default_factory=PlayTimeout.from_env)

    #: Where plays run (:mod:`gpuforge.execution`); None: read from the inventory and
    #: ``GPUFORGE_EXECUTION`` on the first play (still None: one plain ansible-playbook run).
    execution: ExecutionPlan | None = None
    _execution_read: bool = False

    def execution_plan(self) -> ExecutionPlan | None:
        """Where this deploy's plays run (read once): None, locally."""
        if self.execution is None and not self._execution_read:
            self._execution_read = True
            self.execution = plan_for(self.inventory)
        return self.execution

    def _play(
        self,
        name: str,
        playbook: str,
        hosts: list[str],
        *,
        per_round_s: int,
        env: dict[str, str] | None = None,
        inputs: tuple[ProjectInput, ...] = (),
    ) -> RunResult:
        # Local, or shards on execution hosts merged into one result (their record: shards.json).
        result = run_play(
            playbook,
            self.inventory,
            hosts,
            artifact_dir=self.artifacts / name,
            plan=self.execution_plan(),
            inputs=inputs,
            on_event=self.on_event,
            timeout_s=self.play_timeout.for_batch(len(hosts), per_round_s),
            forks=self.play_timeout.forks,
            play_record=self.play_record,
            env=env,
        )
        self.runs[name] = result
        return result

    def preflight(self, hosts: list[str]) -> dict[str, str]:
        # One deadline for the whole batch first: only nodes whose sshd answers go on.
        hostvars = list_inventory(self.inventory).get("_meta", {}).get("hostvars", {})
        silent = reach.probe(reach.targets(hostvars, hosts))
        problems = {h: f"unreachable: {why}" for h, why in silent.items()}
        answering = [h for h in hosts if h not in silent]
        if not answering:
            return problems
        # The probe saw each sshd answer: no retries, and a short wait for the rest.
        env = {"ANSIBLE_SSH_RETRIES": "0", "ANSIBLE_TIMEOUT": str(int(reach.DEADLINE_S))}
        result = self._play(
            "preflight", "preflight.yml", answering, per_round_s=PREFLIGHT_ROUND_S, env=env
        )
        problems.update({h: f"unreachable: {m}" for h, m in result.unreachable.items()})
        problems.update({h: f"preflight: {m}" for h, m in result.failed.items()})
        never = sorted(set(answering) - set(result.hosts) - set(problems))
        problems.update(dict.fromkeys(never, "preflight: the play never reached this host"))
        return problems

    def provision(self, hosts: list[str]) -> dict[str, str]:
        result = self._play(
            "provision", "site.yml", hosts, per_round_s=PROVISION_ROUND_S, inputs=SITE_INPUTS
        )
        failed = dict(result.failed)
        for host, message in result.unreachable.items():
            failed[host] = f"unreachable during provisioning: {message}"
        if result.status not in ("successful", "failed"):
            failed.update(
                {h: f"play {result.status} (rc {result.rc})" for h in hosts if h not in failed}
            )
        return failed

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> ValidationOutcome:
        # New nodes join drained, and srun starts nothing on a drained node: the batch is
        # resumed inside a root-only maintenance window for the acceptance jobs, with a few
        # idle admitted nodes as known-good partners. The window is recorded before Slurm is
        # touched; admit() closes it, and so does the next run after a kill.
        partners = (
            [] if level == "quick" else self.admission.idle_in_service(admitted, self.partners)
        )
        window = ValidationWindow(self.admission, self.reservation, [*hosts, *partners]).open()
        try:
            return self.validate_fn(hosts, level, partners)
        except BaseException:
            window.close()
            raise

    def admit(self, verdicts: list[NodeVerdict]) -> list[NodeAction]:
        # The window validate() opened (or a killed run left): admitted nodes open to users.
        return ValidationWindow(self.admission, self.reservation).admit(verdicts)


def ansible_steps(
    inventory: Path,
    admission: Admission,
    run_dir: Path,
    store: StateStore,
    lock: Path,
    *,
    reservation: str,
    on_event: EventHandler | None = None,
) -> AnsibleSteps:
    """The rollout's real steps (deploy and upgrade): plays, validators, ``admission``."""
    return AnsibleSteps(
        inventory=inventory,
        artifacts=run_dir / "ansible",
        validate_fn=lambda hosts, lvl, peers: validate_with_validators(
            inventory,
            hosts,
            lvl,
            run_dir / "validation",
            reservation=reservation,
            known_good=peers,
            peer_reference=store.latest_measured(peers, PEER_CHECKS),
        ),
        admission=admission,
        reservation=reservation,
        on_event=on_event,
        play_record=play_record(lock),
    )
