"""Pure check judgements on real tool output."""

from __future__ import annotations

from conftest import real

from gpuforge.validate import checks
from gpuforge.validate.parsers import nvidia_smi_xml, nvlink


def test_xid_classification_real_logs() -> None:
    remap = checks.no_hardware_xids(real("kernel/mleng-a100-xid63-row-remapper.txt"))
    assert (remap.ok, remap.warn_only, remap.action) == (False, False, "reset_gpu")
    assert remap.measured == "63@0000:10:1c=reset_gpu"
    bus = checks.no_hardware_xids(real("kernel/gpud-readme-h100-xid79-sxid20034-blockquote.txt"))
    assert (bus.ok, bus.warn_only, bus.action) == (False, False, "reboot")
    assert bus.measured == "79@0000:91:00=reboot"
    # 629 x Xid 13 and 7 x Xid 43 are application faults: a warning, never a drain
    app = checks.no_hardware_xids(real("kernel/gpud-dmesg-decode-iso-xid13-xid43.txt"))
    assert (app.ok, app.warn_only, app.action) == (False, True, "monitor")
    assert app.measured == "13@0000:38:00=monitor,43@0000:38:00=monitor"
    # Xid 45 alone is a follow-on report (action none): passes
    follow = checks.no_hardware_xids(
        real("kernel/ogkm-issue1150-xid45-after-xid145-149-nvlink-excerpt.txt")
    )
    assert (follow.ok, follow.action) == (True, "")
    # fallen off the bus without any Xid line still fails, with Xid 79's action
    off = checks.no_hardware_xids(real("kernel/nvsentinel-issue155-l40-fallen-off-bus-no-xid.txt"))
    assert (off.ok, off.action) == (False, "reboot")
    assert "fallen" in str(off.measured)


def test_xid_strongest_action_wins_and_application_xids_do_not_drain() -> None:
    log = (
        "[  10.1] NVRM: Xid (PCI:0000:1b:00): 13, pid=1, name=python, Graphics Exception\n"
        "[  11.2] NVRM: Xid (PCI:0000:1b:00): 95, pid=1, name=python, Uncontained: FBHUB\n"
        "[  12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
    )
    both = checks.no_hardware_xids(log)
    assert (both.ok, both.action) == (False, "reboot")
    assert both.measured == "79@0000:3b:00=reboot,95@0000:1b:00=reset_gpu"
    unknown = checks.no_hardware_xids("[  1.0] NVRM: Xid (PCI:0000:01:00): 9999, new\n")
    assert (unknown.ok, unknown.warn_only, unknown.action) == (False, True, "monitor")
    assert checks.no_hardware_xids("[  1.0] usb 1-1: new device\n").ok


def test_model_matching() -> None:
    assert checks.model_matches("NVIDIA H100 80GB HBM3", "H100-SXM-80GB")
    assert not checks.model_matches("NVIDIA H100 NVL", "H100-SXM-80GB")
    assert not checks.model_matches("NVIDIA A100-SXM4-40GB", "A100-SXM-80GB")
    assert checks.model_matches("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB")
    assert checks.model_matches("NVIDIA H200", "H200")


def test_exact_version() -> None:
    assert checks.exact_version("2.26.2-1+cuda12.8", "2.26.2").ok
    assert checks.exact_version("1:4.2.3-1", "4.2.3").ok
    assert not checks.exact_version("2.26.20-1", "2.26.2").ok
    assert not checks.exact_version("2.25.1-1+cuda12.8", "2.26.2").ok
    assert not checks.exact_version("", "2.26.2").ok
    assert checks.exact_version("570.133.20", "570.133.20").ok


def test_nvlink_real_outputs() -> None:
    good = nvlink.parse(real("nvidia-smi/nge-h100-80gb-hbm3-nvlink-s.txt"))
    assert checks.nvlink_all_up(good, gpus=len(good.gpus)).ok
    down = nvlink.parse(real("nvidia-smi/aznhc-a100-80gb-nvlink-status-all-links-inactive.txt"))
    assert not checks.nvlink_all_up(down, gpus=len(down.gpus)).ok


def test_a100_xml_healthy() -> None:
    xml = nvidia_smi_xml.parse(real("nvidia-smi/telegraf-a100-sxm4-80gb-mig-q-x.xml.txt"))
    assert checks.ecc_enabled(xml).ok
    assert checks.no_uncorrectable_ecc(xml).ok
    assert checks.row_remap_healthy(xml).ok


def test_sysctl_and_kv() -> None:
    got = checks.parse_kv("net.core.rmem_max = 268435456\nnet.ipv4.tcp_rmem = 4096\t87380 1\n")
    assert checks.sysctl_values(
        got, {"net.core.rmem_max": 268435456, "net.ipv4.tcp_rmem": "4096 87380 1"}
    ).ok
    bad = checks.sysctl_values(got, {"net.core.rmem_max": 1, "kernel.absent": 0})
    assert not bad.ok
    assert "kernel.absent" in str(bad.measured)


def test_read_only_proc_sys_checks_the_boot_values_with_a_note() -> None:
    want = {"net.core.rmem_max": 16777216}
    live = {"net.core.rmem_max": "212992"}  # a container cannot change it
    assert not checks.sysctl_conformance(live, want).ok
    ok = checks.sysctl_conformance(
        live, want, read_only=True, at_boot={"net.core.rmem_max": "16777216"}
    )
    assert ok.ok
    assert ok.detail == checks.READ_ONLY_SYSCTL_NOTE
    assert not ok.warn_only
    bad = checks.sysctl_conformance(live, want, read_only=True, at_boot={})
    assert not bad.ok
    assert "does not set the values" in bad.detail
