"""The RMA evidence bundle (contents, no secrets) and the part's way out and back."""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuforge.admission import JOIN_REASON, Admission, AdmissionRecord
from gpuforge.command import CommandResult
from gpuforge.errors import InputError, OperationError
from gpuforge.health import rma
from gpuforge.history import HistoryStore
from gpuforge.redact import REDACTED, scrub_text
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate.report import write_reports
from gpuforge.validate.result import BatchSummary, CheckResult, Level, Status

from ..history.records import T0, record
from ..slurm.fake import FakeSlurm
from ..test_redact import SALTED

REAL = Path(__file__).parents[2] / "fixtures" / "real"
SMI_XML = REAL / "nvidia-smi" / "telegraf-a100-sxm4-80gb-mig-q-x.xml.txt"
IBSTAT = REAL / "ib" / "gpud-ibstat-h100-node-cx7-400-roce-all-active.txt"
KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
DMI = (
    "system-manufacturer: Supermicro\n"
    "system-product-name: SYS-821GE-TNHR\n"
    "system-serial-number: S123456X4B01234\n"
    "baseboard-serial-number: OM23BS012345\n"
)
FILES = {
    "manifest.json",
    "nvidia-smi-q-x.xml",
    "ibstat.txt",
    "dmidecode.txt",
    "failing-check.txt",
    "xid-history.json",
    "counter-history.json",
    "events.json",
    "burnin.json",
    "nccl.json",
}


@dataclass
class Node:
    """A fake node: answers the bundle's commands from ``answers`` (command prefix -> result)."""

    answers: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    calls: list[tuple[str, float]] = field(default_factory=list)

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        self.calls.append((command, timeout))
        for prefix, (rc, out, err) in self.answers.items():
            if command.startswith(prefix):
                return CommandResult(host, command, rc, out, err)
        return CommandResult(
            host, command, 127, "", f"sh: {command.split(maxsplit=1)[0]}: not found"
        )


def _node() -> Node:
    return Node(
        {
            "nvidia-smi -q -x": (0, SMI_XML.read_text(), ""),
            "ibstat": (0, IBSTAT.read_text(), ""),
            "for k in": (0, DMI, ""),
        }
    )


@pytest.fixture
def history(tmp_path: Path) -> HistoryStore:
    store = HistoryStore.open(tmp_path / "history.db")
    store.ingest(
        [
            record("gpu01", at=T0, counters={"gpu/3/ecc_sbe_volatile": 1}),
            record(
                "gpu01",
                at=T0 + 3600,
                verdict="fail",
                failed=(("gpu.xid", "reboot"),),
                counters={"gpu/3/ecc_sbe_volatile": 7},
                events=[{"time": "2026-11-18T09:00:00Z", "gpu": 3, "event": "xid", "code": 79}],
            ),
        ],
        received=T0 + 3600,
    )
    store.add_event(
        "gpu01", "drain", at=T0 + 3601, check="gpu.xid", action="reboot", source="health"
    )
    return store


def _reports(tmp_path: Path) -> Path:
    results = [
        CheckResult(
            "gpu01", "burnin.dcgm_diag", Status.FAIL, evidence=f"diag\n{KEY}\n", level="burnin"
        ),
        CheckResult("gpu01", "burnin.gpu_burn.min_gflops", Status.PASS, measured=51000.0),
        CheckResult("gpu01", "nccl.allreduce_nvlink", Status.PASS, measured=480.0, level="full"),
        CheckResult("gpu02", "nccl.allreduce_nvlink", Status.PASS, measured=481.0, level="full"),
    ]
    out = tmp_path / "reports" / "lab" / "phase_01" / "validation"
    write_reports(BatchSummary.build(["gpu01", "gpu02"], results, level=Level.FULL), out)
    return tmp_path / "reports" / "lab"


def _members(archive: Path) -> dict[str, str]:
    with tarfile.open(archive, "r:gz") as tar:
        return {
            Path(m.name).name: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }


def test_bundle_holds_the_listed_evidence(tmp_path: Path, history: HistoryStore) -> None:
    inputs = rma.BundleInputs(
        runner=_node(), history=history, report_dirs=[_reports(tmp_path)], clock=lambda: T0 + 7200
    )
    bundle = rma.build_bundle("gpu01", tmp_path / "rma", inputs, why="2 failed remediations")
    assert bundle.archive == tmp_path / "rma" / "gpu01-20261118T130640Z.tar.gz"
    assert bundle.manifest_path == tmp_path / "rma" / "gpu01-20261118T130640Z.json"
    files = _members(bundle.archive)
    assert set(files) == FILES
    manifest = json.loads(files["manifest.json"])
    assert manifest == json.loads(bundle.manifest_path.read_text())
    assert manifest["schema"] == rma.SCHEMA
    assert manifest["check"] == "gpu.xid"  # from the drain event
    hw = manifest["hardware"]
    assert hw["driver_version"] == "535.54.03"
    (gpu,) = hw["gpus"]
    assert gpu["serial"] == "1650522003820"
    assert gpu["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu["vbios_version"] == "92.00.36.00.02"
    assert gpu["board_part_number"] == "692-2G506-0212-002"
    assert gpu["inforom"]["img_version"] == "G506.0212.00.01"
    assert gpu["gsp_firmware_version"] == "535.54.03"
    assert hw["system"]["system_serial_number"] == "S123456X4B01234"
    assert hw["hcas"] and all(ca["firmware_version"] for ca in hw["hcas"])
    # each file is listed with its digest
    listed = {f["name"]: f["sha256"] for f in manifest["files"]}
    for name, text in files.items():
        if name != "manifest.json":
            assert listed[name] == hashlib.sha256(text.encode()).hexdigest()
    assert "79@PCI:0000:91:00" in files["failing-check.txt"]  # the record's raw output
    xids = json.loads(files["xid-history.json"])
    assert [(x["code"], x["gpu"]) for x in xids] == [(79, 3)]
    counters = json.loads(files["counter-history.json"])
    assert [c["counters"]["gpu/3/ecc_sbe_volatile"] for c in counters] == [1, 7]
    burnin = json.loads(files["burnin.json"])
    assert {r["check"] for r in burnin["results"]} == {
        "burnin.dcgm_diag",
        "burnin.gpu_burn.min_gflops",
    }
    nccl = json.loads(files["nccl.json"])
    assert [r["measured"] for r in nccl["results"]] == [480.0]  # gpu01's, not gpu02's
    assert manifest["errors"] == []
    assert all(timeout > 0 for _, timeout in inputs.runner.calls)  # type: ignore[attr-defined]


def test_bundle_carries_no_key_material(tmp_path: Path, history: HistoryStore) -> None:
    node = _node()
    node.answers["for k in"] = (0, DMI + f"password=hunter2\n{KEY}\n", "")
    node.answers["ibstat"] = (1, "", f"ibpanic: token: s3cr3t-t0ken\n{KEY}")
    inputs = rma.BundleInputs(runner=node, history=history, report_dirs=[_reports(tmp_path)])
    bundle = rma.build_bundle(
        "gpu01", tmp_path / "rma", inputs, why="api_key=abc123 leaked in a log"
    )
    texts = [*_members(bundle.archive).values(), bundle.manifest_path.read_text()]
    for text in texts:
        assert "PRIVATE KEY" not in text
        assert "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU" not in text
        assert "hunter2" not in text
        assert "s3cr3t-t0ken" not in text
        assert "abc123" not in text
    manifest = json.loads(texts[0])
    assert any("ibstat" in e for e in manifest["errors"])  # written anyway, failure noted


def test_scrub_keeps_ordinary_text() -> None:
    text = "GPU 3: Xid 79, fallen off the bus\nSerial Number: 1650522003820\n"
    assert scrub_text(text) == text
    assert scrub_text("MUNGE_KEY='abc def'") == f"MUNGE_KEY='{REDACTED}'"


def test_bundle_salted_with_every_secret_pattern_carries_none(
    tmp_path: Path, history: HistoryStore
) -> None:
    salt = "\n".join(text for text, _ in SALTED)
    history.ingest(
        [
            record(
                "gpu01",
                at=T0 + 7200,
                verdict="fail",
                failed=(("gpu.xid", "reboot"),),
                events=[
                    {
                        "time": "2026-11-18T10:00:00Z",
                        "gpu": 3,
                        "event": "xid",
                        "code": 79,
                        "message": salt,
                    }
                ],
            )
        ],
        received=T0 + 7200,
    )
    history.add_event(
        "gpu01",
        "drain",
        at=T0 + 7201,
        check="gpu.xid",
        action="reboot",
        source="health",
        data={"why": salt, "ansible_become_pass": "hunter2"},
    )
    node = _node()
    node.answers["for k in"] = (0, DMI + salt, "")
    inputs = rma.BundleInputs(runner=node, history=history, report_dirs=[_reports(tmp_path)])
    bundle = rma.build_bundle("gpu01", tmp_path / "rma", inputs, why=salt)
    members = _members(bundle.archive)
    texts = [*members.values(), bundle.manifest_path.read_text()]
    for text, secret in SALTED:
        assert not any(secret in t for t in texts), f"{text!r} left {secret!r} in the bundle"
    for name in ("xid-history.json", "events.json", "dmidecode.txt"):
        assert REDACTED in members[name]  # the salt reached the bundle, and was cut there
    assert REDACTED in bundle.manifest["why"]
    for name, text in members.items():
        if name.endswith(".json"):
            json.loads(text)  # scrubbing kept every JSON file valid


def _admission(tmp_path: Path, state: str, reason: str) -> tuple[Admission, FakeSlurm]:
    slurm = FakeSlurm({"gpu01": (state, reason)})
    record = AdmissionRecord(tmp_path / "admission.db")
    return Admission(SlurmClient(slurm, "ctl01"), record, source="remediate"), slurm


def test_out_and_back_drains_for_join_validation(tmp_path: Path, history: HistoryStore) -> None:
    admission, slurm = _admission(tmp_path, "IDLE+DRAIN", "gpuforge:gpu.xid:rma")
    rma.mark_out(admission, history, "gpu01", "VENDOR-42")
    assert rma.open_ticket(history, "gpu01") == "VENDOR-42"
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:gpu.xid:rma")
    action = rma.mark_back(admission, history, "gpu01")
    assert action.action == "drain"
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", JOIN_REASON)
    assert rma.open_ticket(history, "gpu01") is None
    steps = [(e.data or {}).get("step") for e in history.events(node="gpu01", kinds=["rma"])]
    assert steps == ["out", "back"]
    with pytest.raises(OperationError):
        rma.mark_back(admission, history, "gpu01")  # already back


def test_out_refuses_a_node_in_service(tmp_path: Path, history: HistoryStore) -> None:
    admission, _ = _admission(tmp_path, "IDLE", "")
    with pytest.raises(InputError):
        rma.mark_out(admission, history, "gpu01", "VENDOR-42")
    with pytest.raises(InputError):
        rma.mark_out(admission, history, "gpu01", " ")
    assert history.events(node="gpu01", kinds=["rma"]) == []


def test_back_leaves_an_operator_drain(tmp_path: Path, history: HistoryStore) -> None:
    admission, slurm = _admission(tmp_path, "IDLE+DRAIN", "gpuforge:gpu.xid:rma")
    rma.mark_out(admission, history, "gpu01", "VENDOR-42")
    slurm.nodes["gpu01"] = ("IDLE+DRAIN", "new PSU, burn-in by hand")
    action = rma.mark_back(admission, history, "gpu01")
    assert action.action == "none"
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", "new PSU, burn-in by hand")
