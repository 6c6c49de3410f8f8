"""Verify the node_exporter role on the Molecule instance: one fact per test."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"


def test_package_installed(host):
    assert host.package("prometheus-node-exporter").is_installed


@pytest.mark.parametrize(
    "arg",
    [
        "--web.listen-address=:9100",
        "--path.sysfs=/sys",
        f"--collector.textfile.directory={TEXTFILE_DIR}",
        "--collector.infiniband",
    ],
)
def test_arguments(host, arg):
    args = host.file("/etc/default/prometheus-node-exporter").content_string
    assert arg in next(line for line in args.splitlines() if line.startswith("ARGS="))


def test_service_enabled(host):
    assert host.service("prometheus-node-exporter").is_enabled


def test_service_running(host):
    assert host.service("prometheus-node-exporter").is_running


def test_textfile_metric_is_served(host):
    prom = f"{TEXTFILE_DIR}/gpuforge_molecule.prom"
    write = f"printf 'gpuforge_molecule_probe 42\\n' > {prom}.tmp && mv {prom}.tmp {prom}"
    host.run_expect([0], write)
    try:
        out = host.check_output("curl -sf --max-time 10 http://127.0.0.1:9100/metrics")
    finally:
        host.run(f"rm -f {prom}")
    assert "gpuforge_molecule_probe 42" in out.splitlines()


def test_textfile_collector_reads_without_error(host):
    out = host.check_output("curl -sf --max-time 10 http://127.0.0.1:9100/metrics")
    assert "node_textfile_scrape_error 0" in out.splitlines()
