"""health.yaml: defaults, strict validation, errors naming file, line and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.node import config


def test_sample_loads_with_its_values(sample_yaml: str, tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(sample_yaml)
    c = config.load(path)
    assert c.node == "gpu01"
    assert c.collector == config.CollectorConfig("http://10.231.0.1:9477", 2.0)
    assert c.expect.gpus == 8
    assert c.expect.pcie_gen == 5
    assert c.expect.pcie_width == 16
    assert c.expect.rails[0] == config.Rail("mlx5_0", 1, "ib0", 400.0, 4096, "InfiniBand")
    assert c.expect.versions["cuda"] == "12.4"
    assert c.check("fabric.counters").fail_after == 2
    assert c.check("fabric.counters").params["max"]["port_xmit_discards"] == 100
    assert c.timeout("prolog") == 2.0
    assert c.digest.startswith("sha256:")
    assert c.path == path


def test_minimal_file_takes_every_default() -> None:
    c = config.parse("version: 1\nnode: gpu01\n")
    assert c.collector is None
    assert c.sysfs_root == Path("/sys")
    assert c.textfile_dir == Path("/var/lib/prometheus/node-exporter")
    assert c.state_dir == Path("/var/lib/gpuforge/health")
    assert c.tiers == config.TIER_TIMEOUTS
    assert set(c.checks) == set(config.CHECKS)
    assert c.check("fabric.flaps").params == {"down_s": 240, "flaps": 3, "window_h": 12}
    assert c.check("fabric.roce_pfc").shadow is True
    assert c.check("gpu.xid").enabled is True


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "fail_after: 1, pass",
            "fail_after: 0, pass",
            ":19: checks.gpu.xid.fail_after: must be an integer >= 1",
        ),
        (
            "window_s: 3600",
            "window_s: x",
            ":20: checks.fabric.counters.window_s: must be an integer >= 1",
        ),
        ("mtu: 4096", "mtux: 4096", ":10: expect.rails[0].mtux: unknown key"),
        (
            "symbol_error: 10",
            "symbol_error: -1",
            ":21: checks.fabric.counters.max.symbol_error: must be",
        ),
        ("gpu.xid:", "gpu.xidd:", ":19: checks.gpu.xidd: unknown key"),
        (
            "enabled: true, down_s",
            "enabled: yes please, down_s",
            ":23: checks.fabric.flaps.enabled: must be true or false",
        ),
        (
            "timeout_s: 2}\n  epilog",
            "timeout_s: 0}\n  epilog",
            ":16: tiers.prolog.timeout_s: must be a number > 0",
        ),
        ('url: "http://10', 'url: "ftp://10', ":3: collector.url: must be an http"),
        ("version: 1", "version: 2", ":1: version: must be 1"),
        ("sysfs_root: /sys", "sysfs_root: sys", ":4: sysfs_root: must be an absolute path"),
        ("gpus: 8", "gpus: eight", ":6: expect.gpus: must be an integer >= 0"),
        (
            "  prolog:  {",
            "  passive: {timeout_s: 3}\n  prolog:  {",
            ":16: tiers.passive: duplicate key",
        ),
        ("node: gpu01\n", "", "node: missing"),
        ("pcie: {gen: 5", "pcie: {gen: 5, speed: 3", ":9: expect.pcie.speed: unknown key"),
    ],
)
def test_bad_value_is_refused_naming_line_and_key(
    sample_yaml: str, old: str, new: str, message: str
) -> None:
    assert old in sample_yaml
    with pytest.raises(InputError) as err:
        config.parse(sample_yaml.replace(old, new, 1), "/etc/gpuforge/health.yaml")
    assert str(err.value).startswith("/etc/gpuforge/health.yaml")
    assert message in str(err.value)


def test_broken_yaml_names_the_line() -> None:
    with pytest.raises(InputError, match=r"^h\.yaml:4: not valid YAML"):
        config.parse("version: 1\nnode: a\nchecks: {gpu.xid: [\n", "h.yaml")


def test_unreadable_file_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        config.load(tmp_path / "absent.yaml")


def test_disabled_and_shadow_switches(sample_yaml: str) -> None:
    text = sample_yaml.replace(
        "gpu.xid:        {enabled: true, shadow: false", "gpu.xid: {enabled: false, shadow: true"
    )
    c = config.parse(text)
    assert c.check("gpu.xid").enabled is False
    assert c.check("gpu.xid").shadow is True
