"""file_sd targets and Prometheus configs from the spec, checked by the real promtool."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.monitoring.prometheus import servers
from gpuforge.monitoring.render import monitoring_files
from gpuforge.topology import load_cluster
from gpuforge.topology.cluster import Cluster

from ..conftest import EXAMPLES, LAB

PROMTOOL = shutil.which("promtool")
Data = dict[str, Any]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool is missing: make system-deps installs Debian's prometheus"
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False
    )


def _write(files: dict[str, str], root: Path) -> None:
    """Lay the generated files out as a server has them (/etc/prometheus -> ``root``)."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("/etc/prometheus/", f"{root}/monitoring/"))


def _cluster(data: Data, write_spec: Callable[[Data], Path]) -> Cluster:
    return load_cluster(write_spec(data))


def test_node_targets_carry_topology_labels() -> None:
    files = monitoring_files(load_cluster(LAB))
    groups = json.loads(files["monitoring/file_sd/node.json"])
    assert len(groups) == 9
    gpu05 = next(g for g in groups if g["labels"]["node"] == "gpu05")
    assert gpu05 == {
        "targets": ["10.231.0.15:9100"],
        "labels": {
            "cluster": "lab",
            "su": "1",
            "rack": "r002",
            "leaf": "leaf-su01-r0",
            "node_type": "h100-sxm",
            "phase": "2",
            "node": "gpu05",
        },
    }
    ctl = next(g for g in groups if g["labels"]["node"] == "ctl01")
    assert "su" not in ctl["labels"]
    assert "leaf" not in ctl["labels"]


def test_dcgm_targets_only_gpu_nodes() -> None:
    files = monitoring_files(load_cluster(LAB))
    groups = json.loads(files["monitoring/file_sd/dcgm.json"])
    assert [g["targets"][0] for g in groups] == [f"10.231.0.{i}:9400" for i in range(11, 19)]


def test_single_server_config_passes_promtool(tmp_path: Path) -> None:
    _write(monitoring_files(load_cluster(LAB)), tmp_path)
    config = tmp_path / "monitoring" / "prometheus" / "ctl01.yml"
    data = yaml.safe_load(config.read_text())
    assert data["global"]["scrape_interval"] == "30s"
    assert data["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "10.231.0.10:9093"
    ]
    assert not any(
        r.get("action") == "hashmod"
        for job in data["scrape_configs"]
        for r in job.get("relabel_configs", [])
    )
    proc = _promtool("check", "config", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_spec_records_are_generated_and_pass_promtool(tmp_path: Path) -> None:
    files = monitoring_files(load_cluster(LAB))
    rules = tmp_path / "records.yml"
    rules.write_text(files["monitoring/rules/gpuforge-records.yml"])
    proc = _promtool("check", "rules", str(rules))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = yaml.safe_load(rules.read_text())["groups"][0]["rules"]
    budgets = {
        (r["labels"]["rack"], r["expr"])
        for r in data
        if r["record"] == "gpuforge:rack_power_budget_watts"
    }
    assert budgets == {("r001", "vector(44000)"), ("r002", "vector(44000)")}


def _hashmod(values: list[str], modulus: int) -> int:
    """Prometheus' hashmod: md5 of the joined source labels, low 8 bytes big-endian, mod N."""
    digest = hashlib.md5(";".join(values).encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


def test_sharded_configs_pass_promtool_and_split_by_rack(
    lab_data: Data, write_spec: Callable[[Data], Path], tmp_path: Path
) -> None:
    lab_data["monitoring"] = {
        "servers": "ctl01,gpu[01-02]",
        "federation": True,
        "remote_write": [{"name": "thanos", "url": "http://thanos-receive:19291/api/v1/receive"}],
    }
    cluster = _cluster(lab_data, write_spec)
    files = monitoring_files(cluster)
    _write(files, tmp_path)
    names = [f"monitoring/prometheus/{n}.yml" for n in ("ctl01", "gpu01", "gpu02", "global")]
    assert sorted(k for k in files if k.startswith("monitoring/prometheus/")) == sorted(names)
    for rel in names:
        proc = _promtool("check", "config", str(tmp_path / rel))
        assert proc.returncode == 0, rel + proc.stdout + proc.stderr
    shards = []
    for index, name in enumerate(("ctl01", "gpu01", "gpu02")):
        data = yaml.safe_load(files[f"monitoring/prometheus/{name}.yml"])
        assert data["global"]["external_labels"]["shard"] == str(index)
        assert data["remote_write"] == [
            {"name": "thanos", "url": "http://thanos-receive:19291/api/v1/receive"}
        ]
        node_job = next(j for j in data["scrape_configs"] if j["job_name"] == "node")
        hashmod, keep = node_job["relabel_configs"][1:]
        assert hashmod["action"] == "hashmod"
        assert hashmod["modulus"] == 3
        assert hashmod["source_labels"] == ["cluster", "rack"]
        assert keep == {"source_labels": ["__tmp_shard"], "regex": str(index), "action": "keep"}
        shards.append(index)
    assert shards == [0, 1, 2]
    glob = yaml.safe_load(files["monitoring/prometheus/global.yml"])
    federate = glob["scrape_configs"][0]
    assert federate["metrics_path"] == "/federate"
    assert federate["honor_labels"] is True
    assert [t["targets"][0] for t in federate["static_configs"]] == [
        "10.231.0.10:9090",
        "10.231.0.11:9090",
        "10.231.0.12:9090",
    ]


def test_rack_sharding_balances_the_10k_example() -> None:
    """Prometheus' own hash over cluster;rack spreads 1,264 nodes evenly over 4 shards."""
    cluster = load_cluster(EXAMPLES / "cluster-10k.yaml")
    per_shard = [0, 0, 0, 0]
    for node in cluster.nodes:
        per_shard[_hashmod([cluster.name, node.rack], 4)] += 1
    assert sum(per_shard) == len(cluster.nodes)
    assert min(per_shard) > 0.8 * len(cluster.nodes) / 4, per_shard
    assert max(per_shard) < 1.2 * len(cluster.nodes) / 4, per_shard


def test_monitoring_group_defaults_to_the_controllers() -> None:
    assert [s.hostname for s in servers(load_cluster(LAB))] == ["ctl01"]


def test_servers_override_the_monitoring_group(
    lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    lab_data["monitoring"] = {"servers": "gpu[07-08]"}
    cluster = _cluster(lab_data, write_spec)
    from gpuforge.generate import render_files  # noqa: PLC0415
    from gpuforge.inventory.render import groups  # noqa: PLC0415
    from gpuforge.monitoring.render import monitoring_group, monitoring_vars  # noqa: PLC0415

    assert groups(cluster, monitoring_group(cluster))["monitoring"] == ["gpu07", "gpu08"]
    hosts = yaml.safe_load(render_files(cluster)["hosts.yml"])["all"]["children"]
    assert list(hosts["monitoring"]["hosts"]) == ["gpu[07:08]"]
    assert monitoring_vars(cluster)["gpuforge_monitoring_servers"] == ["gpu07", "gpu08"]


def test_monitoring_vars_carry_the_routes(
    lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    lab_data["monitoring"] = {
        "retention": "30d",
        "routes": [{"severity": "critical", "repeat_interval": "30m"}],
    }
    from gpuforge.monitoring.render import monitoring_vars  # noqa: PLC0415

    data = monitoring_vars(_cluster(lab_data, write_spec))
    assert data["prometheus_retention"] == "30d"
    assert data["alertmanager_routes"] == [
        {
            "severity": "critical",
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "30m",
        }
    ]


@pytest.mark.slow
def test_100k_example_file_sd_in_two_seconds() -> None:
    import time  # noqa: PLC0415

    from gpuforge.monitoring.prometheus import config_files  # noqa: PLC0415
    from gpuforge.monitoring.targets import file_sd_files  # noqa: PLC0415

    cluster = load_cluster(EXAMPLES / "cluster-100k.yaml")
    started = time.process_time()  # CPU seconds: a loaded machine's wait is not ours
    targets = file_sd_files(cluster)
    configs = config_files(cluster)
    elapsed = time.process_time() - started
    nodes = len(json.loads(targets["node.json"]))
    assert nodes == len(cluster.nodes)
    assert nodes >= 12_500
    assert configs
    assert elapsed <= 2.0, f"{nodes} nodes took {elapsed:.2f} CPU-s"


@pytest.mark.parametrize("spec", ["lab.yaml", "nvl72.yaml", "cluster-10k.yaml"])
def test_file_sd_files_are_the_target_groups_encoded(spec: str) -> None:
    """Each node's labels encoded once for every exporter change no byte of its file."""
    from gpuforge.monitoring.targets import (  # noqa: PLC0415
        EXPORTERS,
        file_sd_files,
        file_sd_text,
        target_groups,
    )

    cluster = load_cluster(EXAMPLES / spec)
    expected = {f"{e.job}.json": file_sd_text(target_groups(cluster, e)) for e in EXPORTERS}
    assert file_sd_files(cluster) == expected
