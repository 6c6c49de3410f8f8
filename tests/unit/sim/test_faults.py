"""The fault file schema and the per-node state the lab writes from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpuforge_sim.faults import (
    FAULT_KINDS,
    FaultFileError,
    load_fault_file,
    node_state,
    validate_fault_doc,
)

from .conftest import EXAMPLES


def test_example_covers_every_fault_kind() -> None:
    doc = load_fault_file(EXAMPLES / "faults-all.yaml")
    assert {f["kind"] for f in doc["faults"]} == set(FAULT_KINDS)


def test_defaults_are_filled_in() -> None:
    doc = validate_fault_doc({"faults": [{"node": "gpu001", "kind": "slow_nic", "rail": 2}]})
    assert doc["faults"][0] == {
        "kind": "slow_nic",
        "node": "gpu001",
        "rail": 2,
        "factor": 0.5,
        "clears_on": "never",
    }


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"node": "gpu001", "kind": "gpu_lost"}, "unknown fault kind 'gpu_lost'"),
        ({"node": "gpu001", "kind": "gpu_missing"}, "gpu_missing needs 'gpu'"),
        ({"node": "gpu001", "kind": "slow_nic", "rail": 0, "factor": 2}, "'factor' must be"),
        ({"node": "gpu001", "kind": "xid", "gpu": 0, "code": 1}, "code 1 has no simulated"),
        ({"node": "gpu001", "kind": "throttle", "gpu": 0, "reason": "hot"}, "reason must be"),
        ({"node": "gpu001", "kind": "ib_port_down", "gpu": 0, "rail": 0}, "does not take gpu"),
        ({"kind": "missing_peermem"}, "'node' must be a non-empty string"),
    ],
)
def test_schema_errors_name_the_fault(fault: dict[str, Any], message: str) -> None:
    with pytest.raises(FaultFileError, match="faults\\[0\\]") as err:
        validate_fault_doc({"faults": [fault]}, "f.yaml")
    assert message in str(err.value)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "f.yaml"
    bad.write_text("faults:\n  - {node: gpu001, kind: [\n")
    with pytest.raises(FaultFileError, match=r"f\.yaml:\d+: invalid YAML"):
        load_fault_file(bad)


def test_json_fault_file(tmp_path: Path) -> None:
    f = tmp_path / "f.json"
    f.write_text(json.dumps({"faults": [{"node": "gpu001", "kind": "missing_peermem"}]}))
    assert load_fault_file(f)["faults"] == [
        {"kind": "missing_peermem", "node": "gpu001", "clears_on": "reboot"}
    ]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"node": "gpu099", "kind": "missing_peermem"}, "not in this lab"),
        ({"node": "gpu001", "kind": "gpu_missing", "gpu": 8}, "gpu 8 does not exist"),
        ({"node": "gpu001", "kind": "ib_port_down", "rail": 9}, "rail 9 does not exist"),
        ({"leaf": "leaf-nowhere", "kind": "slow_uplink"}, "carries no rail"),
    ],
)
def test_faults_must_fit_the_lab(
    cluster_info: dict[str, Any], fault: dict[str, Any], message: str
) -> None:
    doc = validate_fault_doc({"faults": [fault]})
    with pytest.raises(FaultFileError, match=message):
        node_state(doc, cluster_info, "gpu001")


def test_node_state_holds_the_whole_lab(cluster_info: dict[str, Any]) -> None:
    doc = load_fault_file(EXAMPLES / "faults-all.yaml")
    state = node_state(doc, cluster_info, "gpu007", now=1000.0)
    assert state["hostname"] == "gpu007"
    assert set(state["nodes"]) == {n["hostname"] for n in cluster_info["nodes"]}
    (missing,) = state["nodes"]["gpu002"]["faults"]
    assert missing == {
        "kind": "gpu_missing",
        "gpu": 3,
        "clears_on": "never",
        "injected_at": 1000.0,
        "id": missing["id"],
    }
    assert state["fabric"]["slow_uplinks"] == [{"leaf": "leaf-su01-r1", "factor": 0.25}]
    assert state["package_pins"] == {
        "nvidia_driver_version": "570.124.06",
        "nccl_version": "2.25.1",
    }
    assert state["nodes"]["gpu001"]["gpu_model"] == "H100-SXM-80GB"
    json.dumps(state)  # the lab writes it as JSON


def test_unknown_node_in_node_state(cluster_info: dict[str, Any]) -> None:
    with pytest.raises(FaultFileError, match="not a node of this lab"):
        node_state({"faults": []}, cluster_info, "gpu999")


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_wrong_driver_installs_that_version_on_a_provisioned_node(tmp_path: Path) -> None:
    """The script the lab runs for package_pins: installed packages move, held, from the mirror."""
    import subprocess  # noqa: PLC0415

    from gpuforge_sim.faults import pin_install_script  # noqa: PLC0415

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    installed = {"nvidia-kernel-open-dkms", "nvidia-driver-cuda", "cuda-drivers-570", "libnccl2"}
    case = "|".join(sorted(installed))
    _stub(
        bin_dir,
        "dpkg-query",
        f'eval "p=\\${{$#}}"\ncase "$p" in {case}) echo "install ok installed";; '
        "*) exit 1;; esac\n",
    )
    _stub(
        bin_dir,
        "apt-cache",
        'echo "$2 | 570.133.20-1 | file:/mirror ./ Packages"\n'
        'echo "$2 | 570.124.06-1 | file:/mirror ./ Packages"\n'
        'echo "$2 | 2.25.1-1+cuda12.8 | file:/mirror ./ Packages"\n',
    )
    for tool in ("apt-get", "apt-mark"):
        _stub(bin_dir, tool, f'echo "{tool} $*" >> {log}\n')
    script = pin_install_script({"nvidia_driver_version": "570.124.06", "nccl_version": "2.25.1"})
    proc = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    install = next(c for c in calls if c.startswith("apt-get install"))
    assert "--allow-downgrades" in install
    assert set(install.split()[-4:]) == {
        "libnccl2=2.25.1-1+cuda12.8",
        "nvidia-kernel-open-dkms=570.124.06-1",
        "nvidia-driver-cuda=570.124.06-1",
        "cuda-drivers-570=570.124.06-1",
    }
    assert any(c.startswith("apt-mark hold") and "nvidia-driver-cuda" in c for c in calls)
    assert pin_install_script({}) == ""


def test_wrong_driver_reloads_the_module_so_the_node_runs_that_driver() -> None:
    """wrong_driver is a node running another driver, not one halfway through an upgrade."""
    from gpuforge_sim.faults import pin_install_script  # noqa: PLC0415

    driver = pin_install_script({"nvidia_driver_version": "570.124.06"})
    assert "\nrm -f /run/gpuforge-sim/sys/module/nvidia/version\n" in driver
    assert driver.index("apt-get install") < driver.index("rm -f /run/gpuforge-sim")
    assert "rm -f" not in pin_install_script({"nccl_version": "2.25.1"})
