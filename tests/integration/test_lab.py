"""The container lab end to end: up, SSH with host keys checked, the signed mirror, faults, down.

One 3-node lab (tests/integration/specs/lab3.yaml) is brought up once for the module and torn
down at the end, also when a test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuforge.inventory.reader import InventoryDir, host_vars
from gpuforge.lab import lifecycle, podman
from gpuforge.lab.paths import CONTAINERS_CONF
from gpuforge.resources import project_path

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPEC = Path(__file__).parent / "specs" / "lab3.yaml"
FAULTS = Path(__file__).parent / "specs" / "faults-labtest.yaml"
LAB = "labtest"
NODES = {"tctl01": "10.213.7.20", "tgpu01": "10.213.7.21", "tgpu02": "10.213.7.22"}
GPUFORGE = str(Path(sys.executable).parent / "gpuforge")
ANSIBLE = str(Path(sys.executable).parent / "ansible")


def gpuforge(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))
    return subprocess.run(
        [GPUFORGE, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def on_node(node: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return lifecycle.ssh_run(LAB, node, ["sh", "-c", command], timeout=timeout)


@pytest.fixture(scope="module")
def lab_up() -> Iterator[float]:
    """Bring the test lab up; yields how long ``lab up`` took. Always torn down."""
    lifecycle.down(LAB)
    started = time.monotonic()
    try:
        proc = gpuforge("lab", "up", str(SPEC))
        seconds = time.monotonic() - started
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield seconds
    finally:
        lifecycle.down(LAB)


def test_ansible_pings_every_node_through_the_generated_inventory(lab_up: float) -> None:
    env = dict(os.environ, ANSIBLE_CONFIG=str(lifecycle.state_dir(LAB) / "ansible.cfg"))
    proc = subprocess.run(
        [ANSIBLE, "all", "-m", "ansible.builtin.ping", "-o"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(
        line.split()[0] for line in proc.stdout.splitlines() if "SUCCESS" in line
    ) == sorted(NODES)


def test_the_cluster_directory_alone_reaches_every_node(lab_up: float) -> None:
    """Both layers as two -i sources with the project's ansible.cfg: no lab config needed."""
    inv = lifecycle.inventory_dir(LAB)
    assert sorted(p.name for p in inv.root.iterdir()) == ["generated", "site"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(project_path("ansible.cfg")))
    sources = InventoryDir.open(inv.root).ansible_args()
    proc = subprocess.run(
        [ANSIBLE, *sources, "all", "-m", "ansible.builtin.ping", "-o"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(NODES)


def test_reader_resolves_the_labs_site_layer(lab_up: float) -> None:
    hostvars = host_vars(lifecycle.inventory_dir(LAB).root, "tgpu02")
    assert hostvars["ansible_host"] == NODES["tgpu02"]
    assert hostvars["gpuforge_apt_repo_url"] == f"http://{LAB}-mirror/"
    assert hostvars["gpu_node_type"]["gpus"] == 8  # from the generated layer


@pytest.mark.parametrize("node", sorted(NODES))
def test_node_has_the_spec_hostname(lab_up: float, node: str) -> None:
    assert on_node(node, "hostname").stdout.decode().strip() == node


@pytest.mark.parametrize("node", sorted(NODES))
def test_node_has_its_management_address(lab_up: float, node: str) -> None:
    out = on_node(node, "ip -4 -o addr show").stdout.decode()
    assert f" {NODES[node]}/24 " in out


def test_etc_hosts_resolves_every_node(lab_up: float) -> None:
    out = on_node("tctl01", "getent hosts tgpu02 tgpu01.labtest.gpuforge.test").stdout.decode()
    assert "10.213.7.22" in out
    assert "10.213.7.21" in out


def test_systemd_is_pid_1_and_running(lab_up: float) -> None:
    out = on_node("tgpu01", "ps -o comm= -p 1; systemctl is-system-running || true")
    assert out.stdout.decode().split() == ["systemd", "running"]


def test_host_key_checking_refuses_an_unknown_host(lab_up: float, tmp_path: Path) -> None:
    sdir = lifecycle.state_dir(LAB)
    proc = subprocess.run(
        [
            "ssh",
            "-F",
            str(sdir / "ssh_config"),
            "-o",
            f"UserKnownHostsFile={tmp_path / 'empty'}",
            "-o",
            "BatchMode=yes",
            "tgpu01",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 255
    assert "Host key verification failed" in proc.stderr


def test_lab_private_key_is_private(lab_up: float) -> None:
    key = lifecycle.state_dir(LAB) / "ssh" / "id_ed25519"
    assert key.stat().st_mode & 0o777 == 0o600


def test_node_installs_a_pinned_package_from_the_signed_mirror(lab_up: float) -> None:
    mirror = f"http://{LAB}-mirror"
    on_node(
        "tgpu01",
        f"curl -fsS -o /usr/share/keyrings/gpuforge-lab.gpg {mirror}/gpuforge-lab.gpg && "
        f"echo 'deb [signed-by=/usr/share/keyrings/gpuforge-lab.gpg] {mirror}/ stable main' "
        "> /etc/apt/sources.list.d/gpuforge-lab.list && "
        "apt-get update -o Dir::Etc::sourcelist=/etc/apt/sources.list.d/gpuforge-lab.list "
        "-o Dir::Etc::sourceparts=- && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y gpuforge-lab-hello=1.0.0-1",
        timeout=600,
    )
    out = on_node("tgpu01", "gpuforge-lab-hello && dpkg-query -W gpuforge-lab-hello")
    assert out.stdout.decode().split("\n")[:2] == [
        "gpuforge-lab-hello 1.0.0-1",
        "gpuforge-lab-hello\t1.0.0-1",
    ]


def test_mirror_signature_is_checked(lab_up: float) -> None:
    """With a keyring that did not sign the mirror, apt refuses it."""
    mirror = f"http://{LAB}-mirror"
    proc = subprocess.run(
        lifecycle.ssh_command(
            LAB,
            "tgpu02",
            [
                "sh",
                "-c",
                f"echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror}/ "
                "stable main' > /tmp/wrong.list && apt-get update "
                "-o Dir::Etc::sourcelist=/tmp/wrong.list -o Dir::Etc::sourceparts=- 2>&1",
            ],
        ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "NO_PUBKEY" in proc.stdout or "not signed" in proc.stdout, proc.stdout


def test_simulator_state_is_on_every_node(lab_up: float) -> None:
    for node in NODES:
        state = json.loads(on_node(node, "cat /var/lib/gpuforge-sim/state.json").stdout)
        assert state["hostname"] == node
        assert sorted(state["nodes"]) == sorted(NODES)


def test_faults_reach_the_simulator_state(lab_up: float) -> None:
    proc = gpuforge("lab", "faults", "--lab", LAB, str(FAULTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = json.loads(on_node("tctl01", "cat /var/lib/gpuforge-sim/state.json").stdout)
    assert [f["kind"] for f in state["nodes"]["tgpu02"]["faults"]] == ["gpu_missing"]


def test_status_shows_every_container_running(lab_up: float) -> None:
    proc = gpuforge("lab", "status", "--lab", LAB, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {r["hostname"]: r["state"] for r in rows if r["role"] != "mirror"} == dict.fromkeys(
        NODES, "running"
    )
    assert {r["address"] for r in rows if r["hostname"] in NODES} == set(NODES.values())


def test_idle_node_uses_little_memory(lab_up: float) -> None:
    out = podman.text(
        ["stats", "--no-stream", "--no-reset", "--format", "{{.Name}} {{.MemUsageBytes}}"]
        + [f"{LAB}-{n}" for n in NODES],
        timeout=120,
    )
    for line in out.splitlines():
        name, usage = line.split(" ", 1)
        mib = _to_mib(usage.split("/")[0].strip())
        assert mib < 64, f"{name} uses {mib:.1f} MiB"


def test_second_up_changes_nothing(lab_up: float) -> None:
    before = {c.name: c.started_at for c in podman.containers(f"gpuforge.lab={LAB}")}
    proc = gpuforge("lab", "up", str(SPEC))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unchanged" in proc.stdout, proc.stdout
    after = {c.name: c.started_at for c in podman.containers(f"gpuforge.lab={LAB}")}
    assert after == before


def test_down_leaves_nothing_behind(lab_up: float) -> None:
    started = time.monotonic()
    proc = gpuforge("lab", "down", "--lab", LAB)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert podman.containers(f"gpuforge.lab={LAB}") == []
    assert podman.networks(f"gpuforge.lab={LAB}") == []
    assert not lifecycle.state_dir(LAB).exists()
    assert seconds < 30, f"lab down took {seconds:.1f}s"


def _to_mib(text: str) -> float:
    units = {"kB": 1 / 1024, "KB": 1 / 1024, "MB": 1000**2 / 1024**2, "MiB": 1.0, "GB": 1000.0}
    units |= {"B": 1 / 1024**2, "KiB": 1 / 1024, "GiB": 1024.0}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text) / 1024**2
