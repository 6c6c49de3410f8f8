"""The one cluster context and state paths every command builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.admission import record_path
from gpuforge.cli import context
from gpuforge.command import LocalRunner, SshRunner
from gpuforge.errors import InputError
from gpuforge.history.store import history_path
from gpuforge.resources import project_path
from gpuforge.slurm.control import SlurmClient
from tests.unit.slurm.fake import FakeSlurm

SAMPLE = project_path("inventory", "sample")


def test_state_paths_are_the_records_of_today(tmp_path: Path) -> None:
    paths = context.state_paths(tmp_path, "lab")
    assert paths.root == tmp_path / "lab"
    assert paths.admission_db == record_path(tmp_path, "lab")
    assert paths.history_db == history_path(tmp_path, "lab")
    assert paths.rollout_db == tmp_path / "lab" / "rollout.db"
    assert paths.lock == tmp_path / "lab" / "rollout.lock"
    assert paths.conformance_lock == tmp_path / "lab" / "conformance.lock"


@pytest.mark.parametrize(
    ("cluster", "inventory", "message"),
    [
        ("lab", Path("x"), "not both"),
        (None, None, r"give CLUSTER \(inventory/CLUSTER\) or --inventory DIR"),
    ],
)
def test_cluster_selection_refuses_both_and_neither(
    cluster: str | None, inventory: Path | None, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        context.cluster_root(cluster, inventory)


def test_a_name_means_inventory_slash_name() -> None:
    assert context.cluster_root("lab", None) == Path("inventory") / "lab"
    assert context.cluster_root(None, Path("/x/y")) == Path("/x/y")


def test_the_name_comes_from_topology_json(tmp_path: Path) -> None:
    ctx = context.cluster_context(None, SAMPLE, tmp_path, require_generated=True)
    assert ctx.name == "lab"
    assert ctx.state == context.state_paths(tmp_path, "lab")
    assert ctx.fleet is ctx.fleet  # read once
    assert ctx.fleet.name == "lab"
    assert ctx.path == SAMPLE
    assert not any(tmp_path.iterdir())  # building a context writes nothing


def test_a_directory_without_generated_is_an_unknown_cluster(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"unknown cluster: .* \(no generated/\)"):
        context.cluster_context(None, tmp_path / "nope", tmp_path, require_generated=True)


def test_a_state_only_command_needs_the_name(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="give --cluster NAME"):
        context.state_context(None, tmp_path)
    ctx = context.state_context("lab", tmp_path)
    with pytest.raises(InputError, match="give --inventory DIR"):
        _ = ctx.path


def test_a_spec_without_its_cluster_directory_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="gpuforge inventory generate"):
        context.spec_context("lab", tmp_path / "missing", tmp_path)


def test_slurm_local_or_over_ssh() -> None:
    assert isinstance(context.slurm_client(None, None).runner, LocalRunner)
    assert isinstance(context.slurm_client("local", None).runner, LocalRunner)
    remote = context.slurm_client("ctl01", None)
    assert (remote.host, isinstance(remote.runner, SshRunner)) == ("ctl01", True)


def test_admission_is_recorded_in_the_clusters_record(tmp_path: Path) -> None:
    ctx = context.state_context("lab", tmp_path)
    adm = ctx.admission(SlurmClient(FakeSlurm({"gpu01": ("IDLE", "")}), "ctl01"), "validate")
    assert adm.source == "validate"
    assert adm.record.path == tmp_path / "lab" / "admission.db"
