"""The Slurm HealthCheckProgram script, run against stub tools on PATH."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import real

from gpuforge.validate import xid_catalogue

SCRIPT = Path(__file__).resolve().parents[3] / "validators" / "healthcheck" / "gpuforge-healthcheck"

XML = """<?xml version="1.0" ?>
<nvidia_smi_log>{gpus}</nvidia_smi_log>
"""
GPU = """<gpu id="00000000:{i:02X}:00.0"><ecc_errors><volatile>
<dram_uncorrectable>{unc}</dram_uncorrectable></volatile></ecc_errors><remapped_rows><remapped_row_pending>{pending}</remapped_row_pending>
<remapped_row_failure>No</remapped_row_failure></remapped_rows></gpu>"""


def stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(0o755)


def setup(
    tmp: Path,
    *,
    gpus: int = 8,
    unc: int = 0,
    pending: str = "No",
    dmesg: str = "",
    ibstat: str | None = None,
    state: str = "IDLE",
    reason: str = "(null)",
) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    csv = "".join(f"{i}, 00000000:{i:02X}:00.0\\n" for i in range(gpus))
    xml = XML.format(
        gpus="".join(
            GPU.format(i=i, unc=unc if i == 3 else 0, pending=pending) for i in range(gpus)
        )
    )
    (tmp / "q.xml").write_text(xml, encoding="utf-8")
    (tmp / "dmesg.txt").write_text(dmesg, encoding="utf-8")
    (tmp / "ibstat.txt").write_text(
        ibstat
        if ibstat is not None
        else real("ib/gpud-ibstat-h100-node-cx7-ndr400-ib-bf3-bond.txt"),
        encoding="utf-8",
    )
    stub(bin_dir, "nvidia-smi", f'case "$1" in -q) cat {tmp}/q.xml;; *) printf "{csv}";; esac\n')
    stub(bin_dir, "dmesg", f"cat {tmp}/dmesg.txt\n")
    stub(bin_dir, "ibstat", f"cat {tmp}/ibstat.txt\n")
    stub(
        bin_dir,
        "scontrol",
        f'if [ "$1" = update ]; then echo "$@" >> {tmp}/updates; else '
        f'echo "NodeName=gpu01 State={state} Reason={reason} Partitions=gpu"; fi\n',
    )
    conf = tmp / "hc.conf"
    conf.write_text("GPUS=8\nIB_DEVICES=mlx5_0,mlx5_1\nIB_RATE_GBPS=400\n", encoding="utf-8")
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "GPUFORGE_HC_CONF": str(conf),
        "GPUFORGE_HC_NODE": "gpu01",
        "GPUFORGE_HC_TIMEOUT": "60",
    }


def hc(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def updates(tmp: Path) -> str:
    f = tmp / "updates"
    return f.read_text() if f.exists() else ""


def test_healthy_node_passes(tmp_path: Path) -> None:
    res = hc(setup(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert updates(tmp_path) == ""


def test_missing_gpu_drains(tmp_path: Path) -> None:
    res = hc(setup(tmp_path, gpus=7))
    assert res.returncode == 1
    assert "gpus 7/8" in res.stdout
    assert "State=DRAIN" in updates(tmp_path)
    assert "Reason=gpuforge-hc:" in updates(tmp_path)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"unc": 2}, "ecc_unc=2"),
        ({"pending": "Yes"}, "remap_pending"),
        ({"dmesg": real("kernel/mleng-a100-xid63-row-remapper.txt")}, "xid 63@"),
        ({"dmesg": real("kernel/gpud-readme-h100-xid79-sxid20034-blockquote.txt")}, "xid 79@"),
    ],
)
def test_gpu_faults_drain(tmp_path: Path, kw: dict[str, object], needle: str) -> None:
    res = hc(setup(tmp_path, **kw))  # type: ignore[arg-type]
    assert res.returncode == 1
    assert needle in res.stdout


def test_application_xids_do_not_drain(tmp_path: Path) -> None:
    res = hc(setup(tmp_path, dmesg=real("kernel/gpud-dmesg-decode-iso-xid13-xid43.txt")))
    assert res.returncode == 0, res.stdout


def test_ib_port_down_drains(tmp_path: Path) -> None:
    text = real("ib/gpud-ibstat-h100-node-cx7-ndr400-ib-bf3-bond.txt").replace("Active", "Down", 1)
    res = hc(setup(tmp_path, ibstat=text))
    assert res.returncode == 1
    assert "mlx5_0 Down" in res.stdout


def test_resumes_only_what_it_drained(tmp_path: Path) -> None:
    res = hc(setup(tmp_path, state="IDLE+DRAIN", reason="gpuforge-hc: gpus 7/8"))
    assert res.returncode == 0
    assert "State=RESUME" in updates(tmp_path)


def test_leaves_operator_drain_alone(tmp_path: Path) -> None:
    res = hc(setup(tmp_path, state="IDLE+DRAIN", reason="RMA ticket 17"))
    assert res.returncode == 0
    assert updates(tmp_path) == ""


def test_missing_config_does_not_drain(tmp_path: Path) -> None:
    env = setup(tmp_path)
    env["GPUFORGE_HC_CONF"] = str(tmp_path / "absent.conf")
    assert hc(env).returncode == 2
    assert updates(tmp_path) == ""


def test_hung_tool_is_a_failure(tmp_path: Path) -> None:
    env = setup(tmp_path)
    stub(tmp_path / "bin", "ibstat", "exec sleep 120\n")
    env["GPUFORGE_HC_TIMEOUT"] = "3"
    res = hc(env)
    assert res.returncode == 1
    assert "hung: ibstat" in res.stdout


def test_hardware_xids_follow_the_xid_catalogue() -> None:
    # the script cannot read YAML on the node; its literal set must match the data file
    text = SCRIPT.read_text(encoding="utf-8")
    literal = re.search(r"^HARDWARE_XIDS = (\{[^}]*\})", text, re.MULTILINE)
    assert literal is not None
    drains = {
        code
        for code, entry in xid_catalogue.catalogue().entries.items()
        if entry.action.drains and not entry.user_caused
    }
    assert ast.literal_eval(literal.group(1)) == drains
