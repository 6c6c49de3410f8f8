"""Drift: the node against what its roles recorded (issue 17 item 1)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuforge.node import drift
from gpuforge.validate import checks

NCCL_CONF = "NCCL_IB_HCA=mlx5_0,mlx5_1\n"


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class FakeNode:
    """A node as the probes read it; every field starts as the roles left it."""

    pkgs: dict[str, str] = field(
        default_factory=lambda: {
            "libnccl2": "2.21.5-1+cuda12.4",
            "datacenter-gpu-manager": "1:3.3.6",
        }
    )
    files: dict[str, str] = field(default_factory=lambda: {"/etc/nccl.conf": NCCL_CONF})
    sysctl_values: dict[str, str] = field(
        default_factory=lambda: {"net.core.rmem_max": "268435456"}
    )
    loaded: set[str] = field(default_factory=lambda: {"nvidia", "nvidia_uvm", "nvidia_peermem"})
    units: dict[str, tuple[bool, bool]] = field(
        default_factory=lambda: {"nvidia-dcgm": (True, True), "slurmd": (True, True)}
    )
    broken: set[str] = field(default_factory=set)
    #: Packages on hold (dpkg's selection), as the pinning roles leave them.
    held: set[str] = field(default_factory=lambda: {"libnccl2"})
    #: What sysctl.d sets at boot when /proc/sys is read-only (a container); None: writable.
    at_boot: dict[str, str] | None = None

    def packages(self, names: Sequence[str]) -> dict[str, str]:
        if "package" in self.broken:
            raise drift.ProbeError("dpkg-query: not installed")
        return {n: v for n, v in self.pkgs.items() if n in names}

    def holds(self, names: Sequence[str]) -> set[str]:
        if "hold" in self.broken:
            raise drift.ProbeError("dpkg-query: no answer in 10s")
        return {n for n in names if n in self.held}

    def file_digest(self, path: str) -> str | None:
        text = self.files.get(path)
        return None if text is None else _sha(text)

    def sysctl(self, key: str) -> str | None:
        if "sysctl" in self.broken:
            raise drift.ProbeError(f"{key}: Permission denied")
        return self.sysctl_values.get(key)

    def sysctls_at_boot(self) -> dict[str, str] | None:
        return self.at_boot

    def modules(self) -> set[str]:
        if "module" in self.broken:
            raise drift.ProbeError("lsmod: no answer in 10s")
        return set(self.loaded)

    def services(self, names: Sequence[str]) -> dict[str, tuple[bool, bool]]:
        return {n: self.units[n] for n in names if n in self.units}

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)


def _write(directory: Path) -> None:
    (directory / "state").mkdir(parents=True, exist_ok=True)
    # the nccl role's validator file of another schema sits beside and is not desired state
    (directory / "nccl.json").write_text(json.dumps({"schema": 1, "settings": {}}))
    (directory / "state" / "nccl.json").write_text(
        json.dumps(
            {
                "schema": drift.EXPECTED_SCHEMA,
                "role": "nccl",
                "packages": {"libnccl2": "2.21.5-1+cuda12.4"},
                "files": {"/etc/nccl.conf": _sha(NCCL_CONF)},
            }
        )
    )
    (directory / "state" / "dcgm.json").write_text(
        json.dumps(
            {
                "schema": drift.EXPECTED_SCHEMA,
                "role": "dcgm",
                "packages": {"datacenter-gpu-manager": "1:3.3.6"},
                "services": {"nvidia-dcgm": {"enabled": True, "active": True}},
                "modules": ["nvidia", "nvidia_peermem"],
                "limits": {"/etc/security/limits.d/90-gpuforge.conf": ["* hard memlock unlimited"]},
            }
        )
    )
    (directory / "fabric.json").write_text(
        json.dumps({"schema": 1, "kind": "infiniband", "sysctls": {"net.core.rmem_max": 268435456}})
    )


@pytest.fixture
def node() -> FakeNode:
    fake = FakeNode()
    fake.files["/etc/security/limits.d/90-gpuforge.conf"] = "*  hard  memlock  unlimited\n"
    return fake


def test_a_node_as_recorded_has_no_drift(tmp_path: Path, node: FakeNode) -> None:
    _write(tmp_path)
    report = drift.run(tmp_path, node)
    assert report.items == []
    assert report.errors == []
    assert report.compared == 8
    assert report.check().status == "pass"


def test_every_injected_drift_is_named_with_desired_and_actual(
    tmp_path: Path, node: FakeNode
) -> None:
    _write(tmp_path)
    node.pkgs["libnccl2"] = "2.25.1-1+cuda12.8"  # the simulator's wrong_nccl
    node.files["/etc/nccl.conf"] = NCCL_CONF + "NCCL_DEBUG=INFO\n"  # an edited rendered file
    node.sysctl_values["net.core.rmem_max"] = "212992"
    node.units["nvidia-dcgm"] = (True, False)  # stopped
    node.loaded.discard("nvidia_peermem")
    report = drift.run(tmp_path, node)
    got = {(i.kind, i.item, i.desired, i.actual) for i in report.items}
    assert got == {
        ("package", "libnccl2", "2.21.5-1+cuda12.4", "2.25.1-1+cuda12.8"),
        ("file", "/etc/nccl.conf", _sha(NCCL_CONF), _sha(NCCL_CONF + "NCCL_DEBUG=INFO\n")),
        ("sysctl", "net.core.rmem_max", "268435456", "212992"),
        ("service", "nvidia-dcgm", "active", "not active"),
        ("module", "nvidia_peermem", "loaded", "not loaded"),
    }
    check = report.check()
    assert check.status == "fail"
    assert check.action == "quarantine"
    assert "package=1" in str(check.measured)


def test_a_missing_file_and_a_removed_limit_line_are_drift(tmp_path: Path, node: FakeNode) -> None:
    _write(tmp_path)
    del node.files["/etc/nccl.conf"]
    node.files["/etc/security/limits.d/90-gpuforge.conf"] = "# emptied\n"
    got = {(i.kind, i.actual) for i in drift.run(tmp_path, node).items}
    assert got == {("file", "missing"), ("limit", "missing")}


def test_a_probe_that_cannot_run_is_an_error_not_drift(tmp_path: Path, node: FakeNode) -> None:
    _write(tmp_path)
    node.broken = {"module", "package"}
    report = drift.run(tmp_path, node)
    assert report.items == []
    assert any("lsmod" in e for e in report.errors)
    assert report.check().status == "error"


def test_a_corrupt_expected_file_is_an_error_naming_it(tmp_path: Path, node: FakeNode) -> None:
    _write(tmp_path)
    (tmp_path / "state" / "broken.json").write_text("{not json")
    (tmp_path / "state" / "bad.json").write_text(
        json.dumps({"schema": drift.EXPECTED_SCHEMA, "role": "x", "files": {"/a": "md5:1"}})
    )
    report = drift.run(tmp_path, node)
    assert any("broken.json" in e for e in report.errors)
    assert any("bad.json: files./a: must be sha256:<hex>" in e for e in report.errors)
    assert report.items == []  # the readable files were still compared


def test_nothing_recorded_is_an_error_never_a_pass(tmp_path: Path, node: FakeNode) -> None:
    assert drift.run(tmp_path / "absent", node).check().status == "error"


def test_the_record_carries_the_drift_and_a_fail_verdict(tmp_path: Path, node: FakeNode) -> None:
    _write(tmp_path)
    node.loaded.discard("nvidia")
    record = drift.conformance_record(
        "gpu01",
        "quick",
        started="2026-11-30T19:20:00Z",
        duration_s=1.2,
        report=drift.run(tmp_path, node),
        firmware_versions={"vbios": "96.00.89.00.01"},
    )
    assert record["tier"] == "conformance"
    assert record["verdict"] == "fail"
    assert record["drift"] == [
        {
            "kind": "module",
            "item": "nvidia",
            "desired": "loaded",
            "actual": "not loaded",
        }
    ]
    firmware = next(c for c in record["checks"] if c["check"] == "conformance.firmware")
    assert json.loads(firmware["measured"]) == {"vbios": "96.00.89.00.01"}


def test_metrics_use_the_day2_names(tmp_path: Path, node: FakeNode) -> None:
    _write(tmp_path)
    node.loaded.discard("nvidia")
    record = drift.conformance_record(
        "gpu01",
        "quick",
        started="t",
        duration_s=1,
        report=drift.run(tmp_path, node),
        firmware_versions={},
    )
    text = drift.metrics_text(record, 1000.0)
    assert 'gpuforge_conformance_drift_items{kind="module"} 1' in text
    assert "gpuforge_conformance_status 2" in text
    assert "gpuforge_conformance_last_run_timestamp_seconds 1000" in text


def test_live_system_reads_files_and_sysctls_under_a_root(tmp_path: Path) -> None:
    (tmp_path / "proc/sys/net/core").mkdir(parents=True)
    (tmp_path / "proc/sys/net/core/rmem_max").write_text("212992\n")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nccl.conf").write_text(NCCL_CONF)
    live = drift.LiveSystem(tmp_path)
    assert live.sysctl("net.core.rmem_max") == "212992"
    assert live.sysctl("net.core.absent") is None
    assert live.file_digest("/etc/nccl.conf") == _sha(NCCL_CONF)
    assert live.file_digest("/etc/absent") is None


def test_a_read_only_proc_sys_is_judged_by_what_the_node_applies_at_boot(
    tmp_path: Path, node: FakeNode
) -> None:
    _write(tmp_path)
    node.sysctl_values.clear()  # a container's namespace: the key is not there at all
    node.at_boot = {"net.core.rmem_max": "268435456"}
    assert drift.run(tmp_path, node).items == []
    node.at_boot = {"net.core.rmem_max": "4096"}
    report = drift.run(tmp_path, node)
    assert [(i.item, i.actual) for i in report.items] == [
        ("net.core.rmem_max", "4096 at boot (/proc/sys read-only)")
    ]


def test_a_sysctl_that_cannot_be_read_is_an_error_not_drift(tmp_path: Path, node: FakeNode) -> None:
    _write(tmp_path)
    node.broken.add("sysctl")
    report = drift.run(tmp_path, node)
    assert report.items == []
    assert report.errors == ["sysctl: net.core.rmem_max: Permission denied"]
    assert report.check().status == "error"


def test_boot_values_are_read_as_systemd_sysctl_does(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    mounts = "proc /proc proc rw,nosuid 0 0\nproc /proc/sys proc ro,nosuid,nodev 0 0\n"
    (tmp_path / "proc/self/mounts").write_text(mounts)
    for directory, name, text in [
        ("usr/lib/sysctl.d", "50-default.conf", "net.core.rmem_max = 1\nvm.swappiness=60\n"),
        ("etc/sysctl.d", "50-default.conf", "vm.swappiness = 10\n"),  # hides the vendor file
        ("etc/sysctl.d", "90-gpuforge-infiniband.conf", "-net.ipv4.conf.ib0.arp_announce = 1\n"),
        ("etc/sysctl.d", "99-late.conf", "# a comment\n; another\nnet/core/somaxconn =  4096 \n"),
    ]:
        (tmp_path / directory).mkdir(parents=True, exist_ok=True)
        (tmp_path / directory / name).write_text(text)
    assert drift.LiveSystem(tmp_path).sysctls_at_boot() == {
        "vm.swappiness": "10",
        "net.ipv4.conf.ib0.arp_announce": "1",
        "net.core.somaxconn": "4096",
    }
    (tmp_path / "proc/self/mounts").write_text(mounts.replace("ro,nosuid,nodev", "rw,nosuid"))
    assert drift.LiveSystem(tmp_path).sysctls_at_boot() is None


def test_held_packages_are_installed() -> None:
    out = (
        "libnccl2\t2.26.2-1+cuda12.8\thi \n"  # installed and held: how the roles leave pins
        "libnccl-dev\t2.26.2-1+cuda12.8\tii \n"
        "nvidia-driver\t570.133.20-1\trc \n"  # removed, config files left
        "gone\t\tun \n"
    )
    assert checks.parse_installed(out) == {
        "libnccl2": "2.26.2-1+cuda12.8",
        "libnccl-dev": "2.26.2-1+cuda12.8",
    }


# -- a pinned package's hold (issue 28 item 3: `apt-mark unhold libnccl2` passed on the lab) ------


def _write_held(directory: Path) -> None:
    _write(directory)
    path = directory / "state" / "nccl.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "holds": ["libnccl2"]}))


def test_a_pinned_package_still_held_is_no_drift(tmp_path: Path, node: FakeNode) -> None:
    _write_held(tmp_path)
    report = drift.run(tmp_path, node)
    assert report.items == [] and report.errors == []
    assert report.compared == 9  # the hold is one more item compared
    assert report.check().status == "pass"


def test_a_released_hold_is_drift_beside_a_downgrade_and_an_edited_limits_file(
    tmp_path: Path, node: FakeNode
) -> None:
    _write_held(tmp_path)
    node.held.discard("libnccl2")  # apt-mark unhold libnccl2
    node.pkgs["datacenter-gpu-manager"] = "1:3.3.5"  # a downgraded DCGM
    node.files["/etc/security/limits.d/90-gpuforge.conf"] = "# emptied\n"
    report = drift.run(tmp_path, node)
    got = {(i.kind, i.item, i.desired, i.actual, i.role) for i in report.items}
    assert got == {
        ("package", "libnccl2 hold", "held", "not held", "nccl"),
        ("package", "datacenter-gpu-manager", "1:3.3.6", "1:3.3.5", "dcgm"),
        ("limit", "/etc/security/limits.d/90-gpuforge.conf: * hard memlock unlimited",
         "* hard memlock unlimited", "missing", "dcgm"),
    }  # fmt: skip
    check = report.check()
    assert check.status == "fail" and check.action == "quarantine"
    assert "package libnccl2 hold: desired 'held', actual 'not held'" in str(check.evidence)


def test_a_hold_that_cannot_be_read_is_an_error_not_drift(tmp_path: Path, node: FakeNode) -> None:
    _write_held(tmp_path)
    node.broken = {"hold"}
    report = drift.run(tmp_path, node)
    assert report.items == []
    assert report.errors == ["package hold: dpkg-query: no answer in 10s"]
    assert report.check().status == "error"


def test_the_hold_of_a_package_gone_is_not_asked(tmp_path: Path, node: FakeNode) -> None:
    _write_held(tmp_path)
    del node.pkgs["libnccl2"]
    node.broken = {"hold"}  # never asked: the package's absence is the drift
    items = drift.run(tmp_path, node).items
    assert [(i.item, i.actual) for i in items] == [("libnccl2", "not installed")]


def test_holds_must_be_a_list_of_names(tmp_path: Path) -> None:
    bad = {"schema": drift.EXPECTED_SCHEMA, "role": "nccl", "holds": "libnccl2"}
    with pytest.raises(drift.ExpectedError, match="holds: must be a list"):
        drift.parse_expected(tmp_path / "nccl.json", bad)


def test_live_holds_read_dpkgs_selection_with_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert drift.parse_holds(
        "libnccl2\thold ok installed\nlibnccl-dev\tinstall ok installed\n"
        "old\thold ok config-files\n\tjunk\n"
    ) == {"libnccl2", "old"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dpkg-query"
    fake.write_text(
        "#!/bin/sh\n"
        "[ \"$3\" = 'libnccl2' ] && exec sleep 5\n"
        "printf 'libnccl2\\thold ok installed\\nlibnccl-dev\\tinstall ok installed\\n'\n"
        "exit 1\n"  # dpkg-query: some name not installed
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    live = drift.LiveSystem(tmp_path)
    assert live.holds(["libnccl-dev", "libnccl2", "gone"]) == {"libnccl2"}
    monkeypatch.setattr(drift, "PROBE_TIMEOUT", 0.5)
    with pytest.raises(drift.ProbeError, match="no answer"):
        live.holds(["libnccl2"])
