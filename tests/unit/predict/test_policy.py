"""The nightly ranking's policy file: validation with file/line/field, applied through admission."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuforge.admission import AdmissionRecord, record_path
from gpuforge.cli import main
from gpuforge.errors import InputError
from gpuforge.generate import write_cluster_inventory
from gpuforge.health.fleet import Fleet
from gpuforge.predict import nightly
from gpuforge.predict.policy import DrainPolicy, load, parse
from gpuforge.predict.score import Finding, NodeRisk, RiskReport
from gpuforge.slurm.control import SlurmClient
from gpuforge.topology import load_cluster
from tests.unit.conftest import LAB
from tests.unit.slurm.fake import FakeSlurm

DAY = 86_400.0
GOOD = """\
version: 1
window: 7d
horizon: 5d
drain:
  threshold: 0.7
  max_per_night: 1
  idle_only: false
  shadow: false
  max_fraction: 0.5
"""


def test_a_full_policy_file_reads_back() -> None:
    policy = parse(GOOD, "predict.yaml")
    assert (policy.window_s, policy.horizon_s) == (7 * DAY, 5 * DAY)
    assert policy.drain == DrainPolicy(0.7, 1, idle_only=False, shadow=False, max_fraction=0.5)
    assert parse("", "empty.yaml").drain == DrainPolicy(), "every key has a default"
    assert parse("version: 1\n").drain.shadow is True, "the default is shadow mode"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\ndrain:\n  treshold: 0.7\n", "p.yaml:3: drain.treshold: unknown key"),
        ("version: 1\ndrain:\n  threshold: 1.5\n", "p.yaml:3: drain.threshold: must be a score"),
        ("drain:\n  max_per_night: -1\n", "p.yaml:2: drain.max_per_night: must be an integer >= 0"),
        ("drain:\n  idle_only: sometimes\n", "p.yaml:2: drain.idle_only: must be true or false"),
        ("window: 7 days\n", "p.yaml:1: window: must be a duration"),
        ("version: 1\nhorizon: 0d\n", "p.yaml:2: horizon: must be a duration"),
        ("version: 2\n", "p.yaml:1: version: must be 1"),
        ("drain: [1, 2]\n", "p.yaml:1: drain: must be a mapping"),
        ("drain:\n  shadow: true\n  shadow: false\n", "p.yaml:3: drain.shadow: duplicate key"),
        ("drain: {threshold: 0.5\n", "p.yaml:2: not valid YAML"),
    ],
)
def test_a_bad_policy_is_refused_naming_file_line_and_field(text: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        parse(text, "p.yaml")
    assert str(err.value).startswith(message), str(err.value)


def test_an_unreadable_policy_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load(tmp_path / "missing.yaml")


def test_cli_refuses_a_bad_policy_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    policy = tmp_path / "predict.yaml"
    policy.write_text("drain:\n  max_per_night: many\n")
    data = tmp_path / "h.jsonl"
    data.write_text('{"schema": "gpuforge.telemetry/1"}\n')
    result = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(data), "--policy", str(policy)]
    )
    assert result.exit_code == 2
    assert f"{policy}:2: drain.max_per_night: must be an integer >= 0" in result.output
    assert "Traceback" not in result.output
    both = CliRunner().invoke(
        main,
        ["fleet", "risk", "--telemetry", str(data), "--policy", str(policy), "--drain-top", "1"],
    )
    assert both.exit_code == 2 and "not both" in both.output


def _ranking(*nodes: tuple[str, float]) -> RiskReport:
    risks = tuple(
        NodeRisk(n, s, (Finding("ecc_sbe_rate", "gpu3", s, "rising: ..."),)) for n, s in nodes
    )
    return RiskReport(at=0.0, window_s=7 * DAY, horizon_s=7 * DAY, nodes=risks)


def test_max_per_night_counts_earlier_drains_of_the_night(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    write_cluster_inventory(load_cluster(LAB), root)
    fleet = Fleet.load(root)
    state = tmp_path / "state"
    fake = FakeSlurm({f"gpu{i:02d}": ("IDLE", "") for i in range(1, 9)})
    fake.nodes["gpu03"] = ("ALLOCATED", "")
    policy = DrainPolicy(threshold=0.6, max_per_night=2, idle_only=True, shadow=False,
                         max_fraction=1.0)  # fmt: skip
    ranking = _ranking(("gpu03", 0.95), ("gpu01", 0.9), ("gpu02", 0.8), ("gpu04", 0.5))
    already, out = nightly.nightly(ranking, fleet, SlurmClient(fake), state, policy)
    assert already == 0
    assert [(o.node, o.action) for o in out] == [("gpu03", "busy"), ("gpu01", "drain")]
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:predicted.ecc_sbe_rate:validate")
    # the same night again: one drain made, one left; gpu04 is under the threshold
    already, out = nightly.nightly(ranking, fleet, SlurmClient(fake), state, policy)
    assert already == 1
    assert [(o.node, o.action) for o in out] == [("gpu03", "busy")]
    record = AdmissionRecord(record_path(state, fleet.name))
    assert nightly.drained_tonight(record, shadow=False, now=1e12) == 0, "a night later"


def test_shadow_policy_changes_nothing_and_counts_its_own_decisions(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    write_cluster_inventory(load_cluster(LAB), root)
    fleet = Fleet.load(root)
    fake = FakeSlurm({f"gpu{i:02d}": ("IDLE", "") for i in range(1, 9)})
    policy = DrainPolicy(max_per_night=1, max_fraction=1.0)  # shadow by default
    ranking = _ranking(("gpu01", 0.9), ("gpu02", 0.8))
    _, out = nightly.nightly(ranking, fleet, SlurmClient(fake), tmp_path, policy)
    assert [(o.node, o.action) for o in out] == [("gpu01", "drain")]
    assert fake.nodes["gpu01"] == ("IDLE", ""), "shadow: decided and recorded, nothing changed"
    already, out = nightly.nightly(ranking, fleet, SlurmClient(fake), tmp_path, policy)
    assert (already, out) == (1, [])
