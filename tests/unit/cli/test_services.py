"""The tools find the services: commands run on the ``gpuforge_services`` host over SSH.

A fake ``ssh`` on PATH records its argv and runs the remote line here (or fails as ssh does);
the services host's gpuforge is a script: the real gpuforge for the end-to-end cases, one that
prints its argv and exits 3 for the relay cases.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import gpuforge
from gpuforge.cli import main
from gpuforge.command import remote_line
from gpuforge.generate import write_cluster_inventory
from gpuforge.history import HistoryStore, history_path
from gpuforge.predict.telemetry import write_telemetry
from gpuforge.services import ServicesHost, services_hostname
from gpuforge.topology import load_cluster

from ..conftest import LAB
from ..history.records import T0, record
from ..predict import builders

FAKE_SSH = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_SSH_LOG"
case "$FAKE_SSH_MODE" in
  down) echo "ssh: connect to host 10.9.9.9 port 22: Connection refused" >&2; exit 255 ;;
  hang) exit 124 ;;
esac
eval "last=\\${$#}"
exec sh -c "$last"
"""
ECHO_GPUFORGE = """#!/bin/sh
echo "remote argv: $*"
echo "remote GPUFORGE_SERVICES_HOST=$GPUFORGE_SERVICES_HOST"
echo "remote complaint" >&2
exit 3
"""


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _script(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def _cluster(root: Path, *, group: bool = True, site_hosts: str = "all: {}\n") -> Path:
    write_cluster_inventory(load_cluster(LAB), root)
    hosts = root / "generated" / "hosts.yml"
    data = json.loads(hosts.read_text(encoding="utf-8"))
    children = data["all"]["children"]
    children.pop("gpuforge_services", None)  # whatever the generator says: the test's choice
    if group:
        children["gpuforge_services"] = {"hosts": {"ctl01": None}}
    hosts.write_text(json.dumps(data), encoding="utf-8")
    (root / "site" / "hosts.yml").write_text(site_hosts, encoding="utf-8")
    return root


def _host_vars(root: Path, host: str, **values: str) -> None:
    folder = root / "site" / "host_vars"
    folder.mkdir(exist_ok=True)
    (folder / f"{host}.yml").write_text(json.dumps(values), encoding="utf-8")


def _history(state: Path) -> Path:
    with HistoryStore.open(history_path(state, "lab")) as store:
        store.ingest([record("gpu03", at=T0, verdict="fail", failed=(("gpu.xid", "reboot"),))])
    return state


@pytest.fixture
def ssh_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ssh first on PATH; no state dir or services host named by the environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "ssh", FAKE_SSH)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    monkeypatch.setenv("FAKE_SSH_MODE", "run")
    monkeypatch.delenv("GPUFORGE_STATE_DIR", raising=False)
    monkeypatch.delenv("GPUFORGE_SERVICES_HOST", raising=False)
    monkeypatch.chdir(tmp_path)  # the default state/ and inventory/ are the test's own
    return log


@pytest.fixture
def remote_gpuforge(tmp_path: Path) -> Path:
    """The services host's gpuforge: this checkout's, run as a new process."""
    src = Path(gpuforge.__file__).resolve().parents[1]
    text = f'#!/bin/sh\nPYTHONPATH={src} exec {sys.executable} -m gpuforge "$@"\n'
    return _script(tmp_path / "remote-gpuforge", text)


@pytest.fixture
def echo_gpuforge(tmp_path: Path) -> Path:
    return _script(tmp_path / "echo-gpuforge", ECHO_GPUFORGE)


def _remote_cluster(tmp_path: Path, remote_gpuforge: Path, **connection: str) -> tuple[Path, Path]:
    """A cluster directory whose services host ctl01 runs ``remote_gpuforge`` on it, with a
    history in its own state directory: (cluster directory, that state directory)."""
    root = _cluster(tmp_path / "lab")
    remote_state = _history(tmp_path / "remote-state")
    _host_vars(root, "ctl01", **connection,
               gpuforge_services_gpuforge=str(remote_gpuforge),
               gpuforge_services_cluster_dir=str(root),
               gpuforge_services_state_dir=str(remote_state))  # fmt: skip
    return root, remote_state


def _ssh_argv(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines()


def test_history_runs_on_the_services_host_and_relays_its_output(
    tmp_path: Path, ssh_log: Path, remote_gpuforge: Path
) -> None:
    root, remote_state = _remote_cluster(
        tmp_path, remote_gpuforge, ansible_host="10.9.9.9", ansible_user="admin"
    )
    result = run("health", "history", "gpu03", "--inventory", root, "--limit", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("gpu03 passive: fail at"), result.output
    argv = _ssh_argv(ssh_log)
    assert argv[-3:] == ["admin@10.9.9.9", "--", argv[-1]]
    assert "BatchMode=yes" in argv
    words = ["env", "GPUFORGE_SERVICES_HOST=ctl01", str(remote_gpuforge), "health", "history",
             "gpu03", "--limit", "5", "--inventory", str(root),
             "--state-dir", str(remote_state)]  # fmt: skip
    assert argv[-1] == remote_line(shlex.join(words), 600)


def test_the_remote_exit_status_and_error_come_back(
    tmp_path: Path, ssh_log: Path, remote_gpuforge: Path
) -> None:
    root, remote_state = _remote_cluster(tmp_path, remote_gpuforge)
    result = run("health", "history", "gpu99", "--cluster", "lab", "--inventory", root)
    assert result.exit_code == 2  # both given: refused here, as without a services host
    result = run("health", "history", "gpu99", "--inventory", root)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: no history for gpu99 in {remote_state}/lab/history.db"
    assert ssh_log.is_file()


def test_fleet_status_passes_what_was_given_with_the_hosts_paths(
    tmp_path: Path, ssh_log: Path, echo_gpuforge: Path
) -> None:
    root = _cluster(tmp_path / "lab")
    _host_vars(root, "ctl01", gpuforge_services_gpuforge=str(echo_gpuforge))
    result = run("fleet", "status", "--inventory", root, "--no-slurm", "--limit", "5", "--json")
    assert result.exit_code == 3  # the remote's status, whatever it is
    assert result.stdout.splitlines() == [
        "remote argv: fleet status --no-slurm --limit 5 --json --inventory /etc/gpuforge/cluster "
        "--state-dir /var/lib/gpuforge/state --via local",
        "remote GPUFORGE_SERVICES_HOST=ctl01",
    ]
    assert result.stderr == "remote complaint\n"
    assert _ssh_argv(ssh_log)[-3] == "ctl01"  # no ansible_host or ansible_user: its name


def test_an_explicit_via_is_kept_and_html_is_refused(
    tmp_path: Path, ssh_log: Path, echo_gpuforge: Path
) -> None:
    root = _cluster(tmp_path / "lab")
    _host_vars(root, "ctl01", gpuforge_services_gpuforge=str(echo_gpuforge))
    result = run("fleet", "status", "--inventory", root, "--via", "login01")
    assert result.exit_code == 3
    assert "--via login01 --inventory /etc/gpuforge/cluster" in result.stdout
    assert "--via local" not in result.stdout
    itself = run("fleet", "status", "--inventory", root, "--via", "ctl01")  # no SSH to itself
    assert itself.stdout.splitlines()[0] == (
        "remote argv: fleet status --inventory /etc/gpuforge/cluster "
        "--state-dir /var/lib/gpuforge/state --via local"
    )
    refused = run("fleet", "status", "--inventory", root, "--html", tmp_path / "x.html")
    assert refused.exit_code == 2
    assert "--html names a file on this machine" in refused.stderr
    assert "--here" in refused.stderr
    assert not (tmp_path / "x.html").exists()


def test_make_conformance_runs_there_with_its_reports_and_timeout(
    tmp_path: Path, ssh_log: Path, echo_gpuforge: Path
) -> None:
    root = _cluster(tmp_path / "inventory" / "lab")  # CLUSTER names inventory/lab
    _host_vars(root, "ctl01", gpuforge_services_gpuforge=str(echo_gpuforge),
               gpuforge_services_report_dir="/srv/reports")  # fmt: skip
    result = run("conformance", "run", "--level", "quick", "lab", "--window", "30")
    assert result.exit_code == 3, result.output
    assert result.stdout.splitlines()[0] == (
        "remote argv: conformance run --level quick --window 30 --inventory "
        "/etc/gpuforge/cluster --state-dir /var/lib/gpuforge/state --report-dir /srv/reports "
        "--via local"
    )
    assert _ssh_argv(ssh_log)[-1].startswith(f"timeout -k 5 {30 * 60 + 1800} sh -c ")
    assert not (tmp_path / "build").exists()  # no report here


def test_fleet_risk_from_the_store_runs_there_a_telemetry_file_here(
    tmp_path: Path, ssh_log: Path, echo_gpuforge: Path
) -> None:
    root = _cluster(tmp_path / "lab")
    _host_vars(root, "ctl01", gpuforge_services_gpuforge=str(echo_gpuforge))
    there = run("fleet", "risk", "--from-store", "--inventory", root, "--limit", "3")
    assert there.exit_code == 3
    assert there.stdout.splitlines()[0] == (
        "remote argv: fleet risk --from-store --limit 3 --inventory /etc/gpuforge/cluster "
        "--state-dir /var/lib/gpuforge/state --via local"
    )
    ssh_log.unlink()
    file = tmp_path / "fleet.jsonl"
    with file.open("w", encoding="utf-8") as out:
        write_telemetry(builders.fleet(nodes=8), out)
    here = run("fleet", "risk", "--telemetry", file, "--inventory", root)
    assert here.exit_code == 0, here.output
    assert "fleet risk at" in here.stdout
    assert not ssh_log.exists()


def test_fleet_risk_s_report_dir_and_textfile_go_there_unchanged(
    tmp_path: Path, ssh_log: Path, echo_gpuforge: Path
) -> None:
    # Paths on the services host, where the nightly unit runs: not this machine's, not the
    # services host's conformance report directory.
    root = _cluster(tmp_path / "lab")
    _host_vars(root, "ctl01", gpuforge_services_gpuforge=str(echo_gpuforge),
               gpuforge_services_report_dir="/srv/reports")  # fmt: skip
    kept = ["--report-dir", "/var/lib/gpuforge/risk", "--textfile", "/srv/ne/risk.prom"]
    there = run("fleet", "risk", "--from-store", "--inventory", root, *kept)
    assert there.exit_code == 3
    assert there.stdout.splitlines()[0] == (
        "remote argv: fleet risk --from-store --report-dir /var/lib/gpuforge/risk --textfile "
        "/srv/ne/risk.prom --inventory /etc/gpuforge/cluster "
        "--state-dir /var/lib/gpuforge/state --via local"
    )
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--here"], {}),
        (["--state-dir", "state"], {}),
        ([], {"GPUFORGE_STATE_DIR": "state"}),
        ([], {"GPUFORGE_SERVICES_HOST": "ctl01"}),
    ],
    ids=["here", "state-dir", "state-env", "on-the-services-host"],
)
def test_it_runs_here_when_told_or_on_the_services_host(
    tmp_path: Path,
    ssh_log: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
) -> None:
    root = _cluster(tmp_path / "lab")
    _history(tmp_path / "state")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run("health", "history", "gpu03", "--inventory", root, *args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("gpu03 passive: fail at")
    assert not ssh_log.exists()


def test_without_a_services_group_everything_runs_here(tmp_path: Path, ssh_log: Path) -> None:
    root = _cluster(tmp_path / "inventory" / "lab", group=False)
    _history(tmp_path / "state")
    assert services_hostname(root) is None
    assert ServicesHost.at(root) is None
    for args in (
        ("health", "history", "gpu03", "--inventory", root),
        ("health", "history", "gpu03", "--cluster", "lab"),
        ("fleet", "status", "lab", "--no-slurm"),
        ("fleet", "risk", "--from-store", "lab"),
    ):
        result = run(*args)
        assert result.exit_code == 0, (args, result.output)
    assert not ssh_log.exists()


def test_ssh_down_is_one_line_and_exit_2(
    tmp_path: Path, ssh_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _cluster(tmp_path / "lab")
    _host_vars(root, "ctl01", ansible_host="10.9.9.9")
    monkeypatch.setenv("FAKE_SSH_MODE", "down")
    result = run("fleet", "status", "--inventory", root)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "error: services host ctl01 (10.9.9.9) unreachable over SSH: "
        "ssh: connect to host 10.9.9.9 port 22: Connection refused\n"
    )
    assert isinstance(result.exception, SystemExit)


def test_no_answer_in_time_and_no_gpuforge_there_are_exit_2(
    tmp_path: Path, ssh_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _cluster(tmp_path / "lab")
    _host_vars(root, "ctl01", gpuforge_services_gpuforge=str(tmp_path / "nowhere" / "gpuforge"))
    missing = run("health", "history", "gpu03", "--inventory", root)
    assert missing.exit_code == 2
    assert missing.stderr.startswith(f"error: services host ctl01 (ctl01): cannot run "
                                     f"{tmp_path}/nowhere/gpuforge (")  # fmt: skip
    assert "give --here" in missing.stderr
    assert len(missing.stderr.splitlines()) == 1
    monkeypatch.setenv("FAKE_SSH_MODE", "hang")
    late = run("health", "history", "gpu03", "--inventory", root)
    assert late.exit_code == 2
    assert late.stderr == (
        "error: services host ctl01 (ctl01): no answer within 600s; what ran there was cut short\n"
    )


def test_the_site_layer_may_name_the_services_host(tmp_path: Path, ssh_log: Path) -> None:
    site = (
        "all:\n  children:\n    gpuforge_services:\n"
        "      hosts:\n        svc01: {ansible_host: 10.8.8.8, ansible_port: 2222}\n"
    )
    root = _cluster(tmp_path / "lab", group=False, site_hosts=site)
    assert services_hostname(root) == ("svc01", False)
    host = ServicesHost.at(root)
    assert host is not None
    assert (host.hostname, host.target.address, host.target.port) == ("svc01", "10.8.8.8", 2222)
    assert (host.gpuforge, host.cluster_dir, host.state_dir, host.report_dir) == (
        "/opt/gpuforge/venv/bin/gpuforge",
        "/etc/gpuforge/cluster",
        "/var/lib/gpuforge/state",
        "/var/lib/gpuforge/reports",
    )
    result = run("fleet", "status", "--inventory", root)
    assert result.exit_code == 2  # the fake ssh runs the default gpuforge path: not here
    argv = _ssh_argv(ssh_log)
    assert argv[argv.index("-p") + 1] == "2222"
    assert "--via local" not in argv[-1]  # not a controller: its own default


def test_a_context_knows_its_services_host(tmp_path: Path) -> None:
    from gpuforge.cli.context import cluster_context  # noqa: PLC0415 - the one use

    with_group = cluster_context(None, _cluster(tmp_path / "a"), tmp_path / "state")
    assert with_group.services is not None
    assert (with_group.services.hostname, with_group.services.controller) == ("ctl01", True)
    without = cluster_context(None, _cluster(tmp_path / "b", group=False), tmp_path / "state")
    assert without.services is None


@pytest.mark.parametrize("verb", ["check", "repair"])
def test_store_check_and_repair_run_on_the_services_host(
    tmp_path: Path, ssh_log: Path, remote_gpuforge: Path, verb: str
) -> None:
    root, remote_state = _remote_cluster(
        tmp_path, remote_gpuforge, ansible_host="10.9.9.9", ansible_user="admin"
    )
    result = run("health", "store", verb, "--inventory", root)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{remote_state}/lab/history.db: ok (integrity_check)")
    words = ["env", "GPUFORGE_SERVICES_HOST=ctl01", str(remote_gpuforge), "health", "store",
             verb, "--inventory", str(root), "--state-dir", str(remote_state)]  # fmt: skip
    assert _ssh_argv(ssh_log)[-1] == remote_line(shlex.join(words), 600)
