"""Verify the health role on the Molecule instance: one fact per test."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BUNDLE = "/opt/gpuforge/gpuforge-node.pyz"
CONFIG = "/etc/gpuforge/health.yaml"


def test_pyyaml_installed(host):
    assert host.package("python3-yaml").is_installed


def test_bundle_installed(host):
    f = host.file(BUNDLE)
    assert f.is_file and f.mode == 0o755


def _name(host):
    return host.ansible.get_variables()["inventory_hostname"]


def test_config_is_valid(host):
    out = host.run(f"/usr/bin/python3 {BUNDLE} config check {CONFIG}")
    assert out.rc == 0, out.stderr
    assert f"valid ({_name(host)}," in out.stdout


def test_config_carries_the_inventory(host):
    doc = yaml.safe_load(host.file(CONFIG).content_string)
    assert doc["expect"]["gpus"] == 8
    assert doc["expect"]["nvlink_links_per_gpu"] == 18
    assert doc["expect"]["rails"][0]["device"] == "mlx5_0"
    assert doc["expect"]["versions"]["driver"] == "570.133.20"
    assert doc["collector"] is None
    assert doc["checks"]["fabric.counters"] == {"shadow": True, "fail_after": 3}


def test_bad_config_is_refused_with_the_key(host):
    bad = "version: 1\nnode: node01\nchecks:\n  gpu.xid: {fail_after: 0}\n"
    host.run(f"install -d -m 0700 /tmp/hc && printf '%s' '{bad}' > /tmp/hc/bad.yaml")
    out = host.run(f"/usr/bin/python3 {BUNDLE} config check /tmp/hc/bad.yaml")
    assert out.rc == 2
    assert "checks.gpu.xid.fail_after" in out.stderr


@pytest.mark.parametrize(
    ("wrapper", "tier"),
    [("healthcheck", "passive"), ("prolog", "prolog"), ("epilog", "epilog")],
)
def test_wrapper_runs_its_tier(host, wrapper, tier):
    f = host.file(f"/usr/local/sbin/gpuforge-{wrapper}")
    assert f.mode == 0o755
    assert f"health {tier} --config {CONFIG}" in f.content_string


def test_passive_tier_runs_and_records_on_a_node_without_gpus(host):
    out = host.run("env -i /usr/local/sbin/gpuforge-healthcheck")
    assert out.rc == 0, out.stderr
    record = json.loads(host.file("/var/lib/gpuforge/health/last-passive.json").content_string)
    assert record["node"] == _name(host)
    assert record["tier"] == "passive"
    # no GPU tools here: the GPU checks could not run (error), which never asks for a drain
    assert record["request"] is None


def test_expected_state_records_the_wrappers(host):
    data = json.loads(host.file("/etc/gpuforge/expected/state/health.json").content_string)
    assert set(data["files"]) == {
        CONFIG,
        "/usr/local/sbin/gpuforge-healthcheck",
        "/usr/local/sbin/gpuforge-prolog",
        "/usr/local/sbin/gpuforge-epilog",
    }
