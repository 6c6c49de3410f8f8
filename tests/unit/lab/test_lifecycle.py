"""gpuforge.lab.lifecycle without podman: what up writes, and only when it changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.generate import write_cluster_inventory
from gpuforge.inventory.reader import InventoryDir
from gpuforge.lab import lifecycle
from gpuforge.lab.plan import LabPlan, plan_from_cluster
from gpuforge.topology import load_cluster

from ..conftest import LAB


def test_write_if_changed_reports_only_real_changes(plan: LabPlan, tmp_path: Path) -> None:
    result = lifecycle.UpResult(plan=plan, state_dir=tmp_path)
    lifecycle._write_if_changed(tmp_path / "f", "a\n", result)
    lifecycle._write_if_changed(tmp_path / "f", "a\n", result)
    assert result.files_changed == [str(tmp_path / "f")]
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o600


@pytest.fixture
def lab_inventory(tmp_path: Path) -> tuple[LabPlan, InventoryDir, lifecycle.InventoryWriter]:
    model = load_cluster(LAB)

    def writer(root: Path) -> None:
        write_cluster_inventory(model, root, protect=(LAB,))

    return plan_from_cluster(model), InventoryDir(tmp_path / "inventory"), writer


def test_lab_writes_the_cluster_layout_and_fills_in_the_site(
    lab_inventory: tuple[LabPlan, InventoryDir, lifecycle.InventoryWriter], tmp_path: Path
) -> None:
    plan, inv, writer = lab_inventory
    result = lifecycle.UpResult(plan=plan, state_dir=tmp_path)
    lifecycle._write_inventory(plan, inv, tmp_path / "key", writer, result)
    assert (inv.generated / ".gpuforge-generated").is_file()
    assert "ansible_host" not in (inv.generated / "hosts.yml").read_text()
    assert '"gpu01": {"ansible_host": "10.231.0.11"}' in (inv.site / "hosts.yml").read_text()
    assert "lab-mirror" in (inv.site / "group_vars" / "all" / "mirror.yml").read_text()
    assert (inv.site / "group_vars" / "all" / "slurm.yml").is_file()  # the sample's overrides
    assert result.changed


def test_second_write_changes_nothing_and_keeps_site_edits(
    lab_inventory: tuple[LabPlan, InventoryDir, lifecycle.InventoryWriter], tmp_path: Path
) -> None:
    plan, inv, writer = lab_inventory
    lifecycle._write_inventory(
        plan, inv, tmp_path / "key", writer, lifecycle.UpResult(plan, tmp_path)
    )
    override = inv.site / "group_vars" / "all" / "slurm.yml"
    override.write_text("---\nslurm_extra_config: [DebugFlags=Gres]\n")
    again = lifecycle.UpResult(plan=plan, state_dir=tmp_path)
    lifecycle._write_inventory(plan, inv, tmp_path / "key", writer, again)
    assert not again.changed
    assert override.read_text() == "---\nslurm_extra_config: [DebugFlags=Gres]\n"


def test_the_old_single_directory_lab_inventory_is_replaced(
    lab_inventory: tuple[LabPlan, InventoryDir, lifecycle.InventoryWriter], tmp_path: Path
) -> None:
    plan, inv, writer = lab_inventory
    inv.root.mkdir()
    (inv.root / "hosts.yml").write_text("{}\n")
    (inv.root / "lab.yml").write_text("all: {}\n")
    lifecycle._write_inventory(
        plan, inv, tmp_path / "key", writer, lifecycle.UpResult(plan, tmp_path)
    )
    assert sorted(p.name for p in inv.root.iterdir()) == ["generated", "site"]
