"""The kernel-log cursor and sticky Xids, with real dmesg lines (tests/fixtures/real/kernel)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.conftest import REAL_FIXTURES
from tests.unit.node.simnode import SimNode

XID13 = (REAL_FIXTURES / "kernel/gpud-dmesg-decode-iso-xid13-xid43.txt").read_text().splitlines()
# gpud's README Xid 79 report (tests/fixtures/real/kernel/gpud-readme-h100-...), as
# `dmesg --time-format iso` prints it.
XID79 = [
    "2025-01-21T03:00:00,548779+00:00 NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.",
    "2025-01-21T03:00:00,548783+00:00 NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
]
XID95 = [
    "2025-01-21T04:00:00,000001+00:00 NVRM: Xid (PCI:0000:1b:00): 95, pid=2107, name=python3, "
    "Uncontained: FBHUB. RST: No, D-RST: No",
]


def _node(tmp_path: Path) -> tuple[SimNode, Path]:
    node = SimNode(tmp_path)
    log = tmp_path / "kmsg.txt"
    log.write_text("")
    node._script("dmesg", f"#!/bin/sh\nexec /bin/cat {log}\n")
    node.only("gpu.xid")
    return node, log


def _others() -> list[str]:
    from gpuforge.node.config import CHECKS  # noqa: PLC0415

    return [name for name in CHECKS if name != "gpu.xid"]


def _xid(node: SimNode) -> tuple[str, str, str]:
    out = node.run()
    got = out.record.check("gpu.xid")
    assert got is not None
    req = out.record.request.op if out.record.request else "-"
    return got.status, got.action, req


def test_cursor_sees_each_line_once_and_reboot_xids_stay_until_reboot(tmp_path: Path) -> None:
    node, log = _node(tmp_path)
    log.write_text("\n".join(XID13[:3]) + "\n")
    assert _xid(node) == ("warn", "monitor", "-")  # application Xid 13: the job's fault
    assert _xid(node) == ("pass", "", "-")  # the same lines again: already judged
    log.write_text("\n".join(XID13[:3] + XID79) + "\n")
    assert _xid(node) == ("fail", "reboot", "drain")
    assert _xid(node) == ("fail", "reboot", "drain")  # nothing new, still broken until reboot
    node.set_boot("boot-2", uptime=60.0)
    log.write_text("")
    assert _xid(node) == ("pass", "", "resume")


def test_a_reset_gpu_xid_is_judged_once(tmp_path: Path) -> None:
    node, log = _node(tmp_path)
    log.write_text("\n".join(XID95) + "\n")
    assert _xid(node) == ("fail", "reset_gpu", "drain")
    assert _xid(node) == ("pass", "", "resume")


def test_a_whole_real_log_is_judged_by_the_catalogue(tmp_path: Path) -> None:
    node, log = _node(tmp_path)
    log.write_text("\n".join(XID13) + "\n")
    out = node.run()
    got = out.record.check("gpu.xid")
    assert got is not None
    assert (got.status, got.action) == ("warn", "monitor")
    assert {e.code for e in out.record.events} == {13, 43}
    disabled = {c.check for c in out.record.checks if c.message == "disabled by config"}
    assert disabled == set(_others()) - {"gpu.dcgm_diag"}  # an epilog check


def test_the_journal_when_dmesg_is_not_readable(tmp_path: Path) -> None:
    node, _ = _node(tmp_path)
    # util-linux's message when kernel.dmesg_restrict forbids it, exit 1
    node._script(
        "dmesg",
        "#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n",
    )
    journal = tmp_path / "journal.txt"
    journal.write_text(
        "2025-01-21T03:00:00.548779+0000 gpu01 kernel: NVRM: Xid (PCI:0000:91:00): 79, "
        "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    )
    node._script("journalctl", f"#!/bin/sh\nexec /bin/cat {journal}\n")
    assert _xid(node) == ("fail", "reboot", "drain")
    node.remove_tool("journalctl")
    node.set_boot("boot-2", uptime=60.0)
    status, action, _ = _xid(node)
    assert (status, action) == ("error", "")
