"""The real upgrade steps: admission drains, Slurm job requeue, the site play, the validators."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuforge.admission import Admission
from gpuforge.errors import OperationError
from gpuforge.execution.plays import run_play
from gpuforge.rollout.deploy import ValidationOutcome
from gpuforge.rollout.steps import PROVISION_ROUND_S, SITE_INPUTS, AnsibleSteps
from gpuforge.slurm import control
from gpuforge.slurm.control import NodeAction, SlurmNode
from gpuforge.upgrade.run import UPGRADE_ACTION
from gpuforge.validate.result import CheckResult, NodeVerdict, Status, Verdict

#: Extra variables of the upgrade's play: the driver role reboots a node whose loaded driver
#: differs from the new one (it knows: the module version against the package's), and waits for
#: it to come back; without this it only writes /var/run/reboot-required.
APPLY_VARS = {"nvidia_driver_allow_reboot": True}


@dataclass
class AnsibleUpgradeSteps:
    """:class:`gpuforge.upgrade.run.UpgradeSteps` on real (or lab) nodes.

    Validation and admission are deploy's (:class:`AnsibleSteps`: a maintenance window for the
    acceptance jobs, then admission closes it), so an upgraded node is judged as a new one is.
    """

    deploy: AnsibleSteps

    @property
    def admission(self) -> Admission:
        return self.deploy.admission

    def node_states(self, hosts: list[str]) -> dict[str, SlurmNode]:
        if not hosts:
            return {}
        adm = self.admission
        return {s.name: s for s in control.node_states(adm.slurm, hosts, timeout=adm.timeout)}

    def drain(self, hosts: list[str], check: str) -> list[NodeAction]:
        verdicts = [
            NodeVerdict(
                h,
                Verdict.QUARANTINE,
                (check,),
                (),
                (
                    CheckResult(
                        node=h,
                        check=check,
                        status=Status.FAIL,
                        measured="old versions",
                        expected="the spec's pins",
                        message="rolling upgrade: drained to apply the new versions",
                    ),
                ),
            )
            for h in hosts
        ]
        return self.admission.admit(verdicts, actions=dict.fromkeys(hosts, UPGRADE_ACTION))

    def release(self, hosts: list[str]) -> list[NodeAction]:
        return self.admission.admit([NodeVerdict(h, Verdict.ADMIT) for h in hosts])

    def requeue(self, hosts: list[str]) -> list[str]:
        adm = self.admission
        argv = ["squeue", "-h", "-t", "RUNNING", "-o", "%A", "-w", ",".join(hosts)]
        result = adm.slurm.run(argv, timeout=adm.timeout)
        if result.rc != 0:
            raise OperationError(f"{shlex.join(argv)}: {result.stderr.strip()[:300]}")
        jobs = sorted({j.strip() for j in result.stdout.split() if j.strip().isdigit()})
        if jobs:
            requeue = ["scontrol", "requeue", ",".join(jobs)]
            done = adm.slurm.run(requeue, timeout=adm.timeout)
            if done.rc != 0:
                raise OperationError(f"{shlex.join(requeue)}: {done.stderr.strip()[:300]}")
        return jobs

    def apply(self, hosts: list[str]) -> dict[str, str]:
        deploy = self.deploy
        result = run_play(  # locally or on the execution hosts, as deploy's plays
            "site.yml",
            deploy.inventory,
            hosts,
            plan=deploy.execution_plan(),
            inputs=SITE_INPUTS,
            extravars=APPLY_VARS,
            artifact_dir=deploy.artifacts / "upgrade",
            on_event=deploy.on_event,
            timeout_s=deploy.play_timeout.for_batch(len(hosts), PROVISION_ROUND_S),
            forks=max(deploy.play_timeout.forks, len(hosts)),
            play_record=deploy.play_record,
        )
        failed = dict(result.failed)
        for host, message in result.unreachable.items():
            failed[host] = f"unreachable: {message}"
        if result.status not in ("successful", "failed"):
            failed.update(
                {h: f"play {result.status} (rc {result.rc})" for h in hosts if h not in failed}
            )
        missing = sorted(set(hosts) - set(result.hosts) - set(failed))
        failed.update(dict.fromkeys(missing, "the play never reached this host"))
        return failed

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> ValidationOutcome:
        return self.deploy.validate(hosts, level, admitted)

    def admit(self, verdicts: Sequence[NodeVerdict]) -> list[NodeAction]:
        return self.deploy.admit(list(verdicts))

    def quarantine(self, reasons: Mapping[str, str]) -> list[NodeAction]:
        verdicts = [
            NodeVerdict(
                h,
                Verdict.QUARANTINE,
                (check,),
                (),
                (CheckResult(node=h, check=check, status=Status.FAIL, message="upgrade failed"),),
            )
            for h, check in reasons.items()
        ]
        return self.admission.admit(verdicts, actions=dict.fromkeys(reasons, "quarantine"))
