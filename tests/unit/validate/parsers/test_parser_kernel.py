"""gpu-burn verdicts and kernel-log Xid / SXid lines."""

from __future__ import annotations

import pytest

from gpuforge.validate.parsers import ParseError, gpu_burn, xid

from ._real import real_text

# gpu-burn ----------------------------------------------------------------------------------


def test_gpu_burn_healthy_run() -> None:
    result = gpu_burn.parse(real_text("kernel/superbench-a100-80gb-8gpu-gpu_burn.txt"))
    assert result.complete
    assert result.tested == 8
    assert result.passed
    assert [g.verdict for g in result.gpus] == ["OK"] * 8
    assert [g.errors for g in result.gpus] == [0] * 8
    assert result.last_progress_percent == 100.0
    assert result.warnings == ()


def test_gpu_burn_gflops_and_names_from_last_record() -> None:
    gpu = gpu_burn.parse(real_text("kernel/superbench-a100-80gb-8gpu-gpu_burn.txt")).gpus[0]
    assert (gpu.gflops, gpu.iterations, gpu.temperature_c) == (16942.0, 6783, 62)
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-b876c63f-396c-f826-5cd0-6b8409990352"


def test_gpu_burn_faulty_despite_exit_code_zero() -> None:
    result = gpu_burn.parse(real_text("kernel/gpuburn-issue12-16gpu-faulty-summary.txt"))
    assert result.tested == 16
    assert not result.passed
    assert [g.verdict for g in result.gpus] == ["FAULTY"] * 16


def test_gpu_burn_overflowed_error_counts_are_kept() -> None:
    gpus = gpu_burn.parse(real_text("kernel/gpuburn-issue12-16gpu-faulty-summary.txt")).gpus
    flagged = [g.index for g in gpus if g.error_warning]
    assert flagged == [1, 2, 3, 4, 9, 11, 14]
    assert {gpus[i].errors for i in flagged} == {-524288000}
    assert gpus[15].temperature_c == 52


def test_gpu_burn_without_summary_is_not_a_pass() -> None:
    text = real_text("kernel/superbench-a100-80gb-8gpu-gpu_burn.txt").split("Tested 8 GPUs:")[0]
    result = gpu_burn.parse(text)
    assert not result.complete
    assert not result.passed
    assert any("did not finish" in w for w in result.warnings)


def test_gpu_burn_missing_verdict_is_reported() -> None:
    text = real_text("kernel/superbench-a100-80gb-8gpu-gpu_burn.txt").replace("\tGPU 7: OK", "")
    result = gpu_burn.parse(text)
    assert any("'Tested 8 GPUs:' but 7" in w for w in result.warnings)
    assert result.gpus[7].verdict is None
    assert not result.passed


# Xid ----------------------------------------------------------------------------------------


def test_xid_dmesg_iso_counts() -> None:
    report = xid.parse(real_text("kernel/gpud-dmesg-decode-iso-xid13-xid43.txt"))
    assert report.xid_counts == {13: 629, 43: 7}
    assert report.lines_scanned == 636
    first = report.xids[0]
    assert first.timestamp == "2025-01-21T02:21:33,498559+00:00"
    assert first.pci == "0000:38:00"
    assert first.pid is None  # pid='<unknown>'
    assert first.message.startswith("Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0)")
    assert (first.category, first.action) == ("application", "monitor")


def test_xid_row_remapper_line() -> None:
    (event,) = xid.parse(real_text("kernel/mleng-a100-xid63-row-remapper.txt")).xids
    assert (event.pci, event.xid, event.pid, event.timestamp) == ("0000:10:1c", 63, "1896", None)
    assert event.message == "Row Remapper: New row marked for remapping, reset gpu to activate."
    assert (event.category, event.action) == ("memory", "reset_gpu")


def test_xid_fallen_off_bus_and_sxids_in_blockquote() -> None:
    report = xid.parse(real_text("kernel/gpud-readme-h100-xid79-sxid20034-blockquote.txt"))
    (event,) = report.xids
    assert (event.xid, event.pci, event.timestamp) == (79, "0000:91:00", "6781741.548779")
    assert (event.category, event.action) == ("bus", "reboot")
    assert len(report.sxids) == 8
    assert {s.sxid for s in report.sxids} == {20034}
    assert {s.switch for s in report.sxids} == {
        "nvidia-nvswitch0",
        "nvidia-nvswitch1",
        "nvidia-nvswitch2",
    }
    fatal = [s for s in report.sxids if s.fatal]
    assert fatal[0].message == "Fatal, Link 48 LTSSM Fault Up"
    assert len(fatal) == 4
    assert [d.pci for d in report.bus_drops] == ["0000:91:00.0"]


def test_fallen_off_bus_without_xid() -> None:
    report = xid.parse(real_text("kernel/nvsentinel-issue155-l40-fallen-off-bus-no-xid.txt"))
    assert report.xids == ()
    (drop,) = report.bus_drops
    assert (drop.pci, drop.timestamp, drop.line) == ("0000:b3:00.0", "1843.308145", 1)
    assert report.driver_version == "570.158.01"


def test_xid_syslog_prefix_and_process() -> None:
    report = xid.parse(real_text("kernel/ogkm-issue1150-xid45-after-xid145-149-nvlink-excerpt.txt"))
    assert report.xid_counts == {45: 7}
    assert {e.process for e in report.xids} == {"python3"}
    assert {e.pci for e in report.xids} == {"0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00"}
    assert report.xids[0].message == "Ch 00000001 caused by previous Xid 149"


def test_syslog_without_gpu_events_is_clean_not_refused() -> None:
    report = xid.parse(real_text("ib/aznhc-syslog-ib6-lost-carrier-flaps.txt"))
    assert report.lines_scanned == 14
    assert report.xids == ()
    assert report.bus_drops == ()


@pytest.mark.parametrize(
    ("number", "category", "action"),
    [
        (13, "application", "monitor"),
        (31, "application", "monitor"),
        (43, "application", "monitor"),
        (45, "application", "none"),
        (48, "memory", "reset_gpu"),
        (63, "memory", "reset_gpu"),
        (64, "memory", "reset_gpu"),
        (74, "nvlink", "reboot"),
        (79, "bus", "reboot"),
        (92, "memory", "monitor"),
        (94, "memory", "monitor"),
        (95, "memory", "reset_gpu"),
        (119, "gsp", "reset_gpu"),
        (120, "gsp", "reset_gpu"),
        (145, "nvlink", "reset_gpu"),
        (150, "nvlink", "reset_gpu"),
    ],
)
def test_xid_catalog(number: int, category: str, action: str) -> None:
    entry = xid.classify(number)
    assert (entry.category, entry.action) == (category, action)


def test_unknown_xid_is_flagged_for_monitoring() -> None:
    assert (xid.classify(9999).code, xid.classify(9999).category) == (9999, "unknown")
    report = xid.parse("[  12.5] NVRM: Xid (PCI:0000:01:00): 9999, pid=1, something new\n")
    assert (report.xids[0].category, report.xids[0].action) == ("unknown", "monitor")


def test_xid_journal_with_syslog_date() -> None:
    line = (
        "Nov 30 04:51:43 gpu001 kernel: NVRM: Xid (PCI:0000:1b:00): 94, pid=4242, "
        "name=python, Contained: SM (0x1). RST: No, D-RST: No\n"
    )
    (event,) = xid.parse(line).xids
    assert (event.timestamp, event.xid, event.process) == ("Nov 30 04:51:43", 94, "python")
    assert event.message == "Contained: SM (0x1). RST: No, D-RST: No"


def test_not_a_kernel_log_is_refused() -> None:
    with pytest.raises(ParseError, match="no kernel-log line") as caught:
        xid.parse(real_text("kernel/superbench-a100-80gb-8gpu-gpu_burn.txt"))
    assert caught.value.line == 1


def test_plain_dmesg_iso_lines_keep_their_time() -> None:
    # `dmesg --time-format iso` without -x: the health checker's cursor and the history's event
    # times need it (a None time made the collector refuse the whole record)
    text = (
        "2026-11-30T20:25:52,447999+00:00 NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n"
    )
    (event,) = xid.parse(text).xids
    assert event.timestamp == "2026-11-30T20:25:52,447999+00:00"
    assert (event.xid, event.pci) == (79, "0000:3a:00")
