"""The zipapp: built from the sources, runs with the node's bare python3 (stdlib + PyYAML)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from gpuforge.node import bundle
from gpuforge.node.__main__ import main
from tests.unit.node.conftest import SAMPLE

PYTHON = "/usr/bin/python3"  # Debian's, with python3-yaml: what a node has


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle.build(tmp_path_factory.mktemp("bundle"))


def _node_python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-I", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""},
        check=False,
    )


def test_zipapp_config_check_valid_and_invalid(pyz: Path, tmp_path: Path) -> None:
    good = tmp_path / "health.yaml"
    good.write_text(SAMPLE)
    done = _node_python(str(pyz), "config", "check", str(good))
    assert done.returncode == 0, done.stderr
    assert "valid (gpu01" in done.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(SAMPLE.replace("fail_after: 1, pass", "fail_after: 0, pass"))
    done = _node_python(str(pyz), "config", "check", str(bad))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"gpuforge-node: {bad}:19: checks.gpu.xid.fail_after: must be an integer >= 1"
    )
    assert "Traceback" not in done.stderr


def test_zipapp_imports_only_stdlib_yaml_and_its_own_modules(pyz: Path) -> None:
    names = sorted(
        n[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for n in zipfile.ZipFile(pyz).namelist()
        if n.startswith("gpuforge/") and n.endswith(".py")
    )
    assert "gpuforge.node.engine" in names
    assert "gpuforge.node.bundle" not in names
    script = (
        "import importlib, sys\n"
        "before = set(sys.modules)\n"
        f"sys.path[:] = [{str(pyz)!r}] + [p for p in sys.path if 'site-packages' not in p]\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "from gpuforge.validate.xid_catalogue import lookup\n"
        "assert lookup(79).action.value == 'reboot'\n"
        "allowed = set(sys.stdlib_module_names) | {'gpuforge', 'yaml', '_yaml', 'cython_runtime'}\n"
        "foreign = sorted({m.split('.')[0] for m in set(sys.modules) - before} - allowed)\n"
        "print(','.join(foreign))\n"
    )
    done = _node_python("-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_zipapp_is_reproducible(pyz: Path, tmp_path: Path) -> None:
    again = bundle.build(tmp_path / "gpuforge-node.pyz")
    assert again.read_bytes() == pyz.read_bytes()


def test_cli_usage_and_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["health", "hourly"])
    assert exit_info.value.code == 2
    assert main(["config", "check", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_prolog_with_a_broken_config_does_not_drain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "health.yaml"
    bad.write_text("version: 1\nnode: gpu01\nbogus: 1\n")
    assert main(["health", "prolog", "--config", str(bad)]) == 0
    assert "bogus: unknown key" in capsys.readouterr().err
    assert main(["health", "passive", "--config", str(bad)]) == 2


def test_health_clear_forgets_sticky_xids(tmp_path: Path) -> None:
    config = tmp_path / "health.yaml"
    config.write_text(f"version: 1\nnode: gpu01\nstate_dir: {tmp_path}/state\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state/state.json").write_text(
        '{"schema": 1, "sticky_xids": ["NVRM: Xid (PCI:0000:91:00): 79, pid=1"], '
        '"streaks": {"gpu.xid": {"fails": 1, "passes": 0, "latched": true, '
        '"action": "reboot", "last": "fail"}}}'
    )
    assert main(["health", "clear", "gpu.xid", "--config", str(config)]) == 0
    state = (tmp_path / "state/state.json").read_text()
    assert "Xid" not in state
    assert "latched" not in state
    assert main(["health", "clear", "gpu.bogus", "--config", str(config)]) == 2


def test_a_broken_checker_never_fails_the_prolog(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    config = tmp_path / "health.yaml"
    config.write_text(f"version: 1\nnode: gpu01\nstate_dir: {blocker}/state\n")
    assert main(["health", "prolog", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("gpuforge-node: health prolog: ")
    assert main(["health", "passive", "--config", str(config)]) == 1
