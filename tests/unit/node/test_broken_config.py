"""A broken health.yaml or a broken checker never fails the prolog or the epilog.

A non-zero Prolog or Epilog makes slurmd drain the node behind the collector's circuit breaker
(docs/health.md, "Exit status"). Every way the config can break, and a probe that crashes, must
give exit 0 and one line from both, never a traceback; the bounded reader refuses the hostile
files in well under a second and 100 MB, in-process and as the zipapp under ``python3 -I``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuforge.node import bundle, engine
from gpuforge.node.__main__ import main

PYTHON = "/usr/bin/python3"  # Debian's, with python3-yaml: what a node has
#: CPU seconds of the interpreter's own start and the zipapp's imports (not the reading): CPU
#: time, not wall time, so a loaded machine does not fail the test.
_STARTUP_S = 1.0
_ARGS = ("--quiet", "--config")
_NODE = (PYTHON, "-I")
GOOD = "version: 1\nnode: gpu01\n"


def _nested(depth: int) -> str:
    return "".join(f"{' ' * i}k:\n" for i in range(depth)) + f"{' ' * depth}x: 1\n"


_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
)

#: name -> (health.yaml text, or None: the path is made otherwise; the words the line names).
BROKEN: dict[str, tuple[str | None, str]] = {
    "missing": (None, "cannot read"),
    "directory": (None, "cannot read"),
    "huge": (None, "larger than 64 KiB"),
    "not-utf8": (None, "not UTF-8"),
    "empty": ("", "empty file"),
    "not-yaml": ("version: 1\nnode: [gpu01\n", "not valid YAML"),
    "not-a-mapping": ("- 1\n- 2\n", "must be a mapping"),
    "billion-laughs": (GOOD + _LAUGHS, "aliases expanded"),
    "recursive-alias": (GOOD + "x: &a [*a]\n", "recursive alias"),
    "deep-block": (GOOD + _nested(300), "nested deeper than 64"),
    "deep-flow": (GOOD + "x: " + "[" * 3000 + "]" * 3000 + "\n", "nested deeper than 64"),
    "bad-tag": (GOOD + "spool_max: !!int ''\n", "not valid YAML"),
    "wrong-type": ("version: 1\nnode: gpu01\nspool_max: many\n", "spool_max: must be an integer"),
    "wrong-version": ("version: two\nnode: gpu01\n", "version: must be 1"),
    "unknown-key": (GOOD + "bogus: 1\n", "bogus: unknown key"),
    "duplicate-key": (GOOD + "node: gpu02\n", "duplicate key"),
    "timeout-1e300": (GOOD + "tiers: {prolog: {timeout_s: 1.0e+300}}\n", "must be a number <="),
    "collector-1e300": (
        GOOD + "collector: {url: 'http://c:1', timeout_s: 1.0e+300}\n",
        "must be a number <=",
    ),
    "url-crlf": (GOOD + 'collector: {url: "http://c:1/\\r\\nX: y"}\n', "control characters"),
    "url-port": (GOOD + "collector: {url: 'http://c:99999'}\n", "not a usable URL"),
    "url-no-host": (GOOD + "collector: {url: 'http://:80'}\n", "must name a host"),
    "nul-state-dir": (GOOD + 'state_dir: "/var/lib/x\\0y"\n', "control characters"),
    "node-newline": ('version: 1\nnode: "gpu01\\nX"\n', "node: must not hold control"),
    "node-not-a-name": ("version: 1\nnode: 'gpu 01'\n", "node: must be a host name"),
    "fail-after-0": (GOOD + "checks: {gpu.xid: {fail_after: 0}}\n", "must be an integer >= 1"),
}


def _make(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    text, _ = BROKEN[name]
    if text is not None:
        path.write_text(text, encoding="utf-8")
    elif name == "directory":
        path.mkdir()
    elif name == "huge":
        with path.open("wb") as handle:  # 200 MB, sparse: only the head is ever read
            handle.write(GOOD.encode())
            handle.truncate(200 << 20)
    elif name == "not-utf8":
        path.write_bytes(GOOD.encode() + b"x: \xff\xfe\n")
    return path


@pytest.mark.parametrize("name", sorted(BROKEN))
@pytest.mark.parametrize("tier", ["prolog", "epilog"])
def test_a_broken_config_allows_the_job_in_one_line(
    name: str, tier: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _make(tmp_path, name)
    started = time.monotonic()
    assert main(["health", tier, "--config", str(path), "--quiet"]) == 0
    assert time.monotonic() - started < 1.0
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    allowed = "job allowed" if tier == "prolog" else "node not drained"
    assert lines[0].startswith(f"gpuforge-node: health {tier}: config error: "), err
    assert lines[0].endswith(f": {allowed}"), err
    assert BROKEN[name][1] in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_config_check_and_passive_refuse_it(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _make(tmp_path, name)
    assert main(["config", "check", str(path)]) == 2
    assert main(["health", "passive", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 2, err
    assert "Traceback" not in err


def _boom(probe: object) -> object:
    raise RuntimeError("probe crashed\nsecond line")


def _late(probe: object) -> object:
    raise TimeoutError("tier budget spent")


@pytest.mark.parametrize("fault", [_boom, _late, RecursionError])
@pytest.mark.parametrize("tier", ["prolog", "epilog"])
def test_a_crash_inside_a_probe_allows_the_job(
    fault: Callable[[object], object],
    tier: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def crash(probe: object) -> object:
        if isinstance(fault, type):
            raise fault("maximum recursion depth exceeded")
        return fault(probe)

    monkeypatch.setitem(engine.TIERS, tier, {"gpu.xid": crash})
    monkeypatch.setitem(engine.TIERS, "passive", {"gpu.xid": crash})
    config = tmp_path / "health.yaml"
    config.write_text(f"version: 1\nnode: gpu01\nstate_dir: {tmp_path}/state\n")
    (tmp_path / "state").mkdir()
    assert main(["health", tier, "--config", str(config), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"gpuforge-node: health {tier}: checker error: "), err
    assert "Traceback" not in err
    # passive reports the checker's own failure as such (1), never as a verdict.
    assert main(["health", "passive", "--config", str(config), "--quiet"]) == 1


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle.build(tmp_path_factory.mktemp("bundle"))


_MEASURE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60)\n"
    "use = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "t, rss = use.ru_utime + use.ru_stime, use.ru_maxrss\n"
    "sys.stdout.write(f'{done.returncode} {t:.3f} {rss}\\n' + done.stdout)\n"
    "sys.stderr.write(done.stderr)\n"
)


@pytest.mark.parametrize(
    "name", ["billion-laughs", "recursive-alias", "deep-block", "deep-flow", "huge", "empty"]
)
def test_the_zipapp_allows_the_job_fast_and_small(name: str, pyz: Path, tmp_path: Path) -> None:
    path = _make(tmp_path, name)
    for tier in ("prolog", "epilog"):
        done = subprocess.run(
            [PYTHON, "-I", "-c", _MEASURE, *_NODE, str(pyz), "health", tier, *_ARGS, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""},
            check=False,
        )
        rc, seconds, rss_kib = done.stdout.split()[:3]
        assert rc == "0", done.stderr
        assert float(seconds) < 1.0 + _STARTUP_S
        assert int(rss_kib) < 100 * 1024
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert BROKEN[name][1] in done.stderr


WRAPPER = Path(__file__).resolve().parents[3] / "roles/health/templates/gpuforge-wrapper.j2"

#: name -> (the checker's code, the wrapper's exit per tier, what its line says when it is 0).
_FAKE_CHECKERS: dict[str, tuple[str, dict[str, int], str]] = {
    "blocks": ("import sys; sys.exit(1)", {"prolog": 1, "epilog": 0}, "exit 1"),
    "passes": ("import sys; sys.exit(0)", {"prolog": 0, "epilog": 0}, ""),
    "usage": ("import sys; sys.exit(2)", {"prolog": 0, "epilog": 0}, "exit 2"),
    "killed": (
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        {"prolog": 0, "epilog": 0},
        "killed after its time budget",
    ),
}


@pytest.mark.parametrize("fake", sorted(_FAKE_CHECKERS))
@pytest.mark.parametrize("tier", ["prolog", "epilog"])
def test_the_wrapper_passes_only_the_prologs_own_block(
    fake: str, tier: str, tmp_path: Path
) -> None:
    jinja2 = pytest.importorskip("jinja2")
    code, exits, why = _FAKE_CHECKERS[fake]
    checker = tmp_path / "checker.py"
    checker.write_text(code + "\n")
    script = tmp_path / f"gpuforge-{tier}"
    template = jinja2.Environment(trim_blocks=True).from_string(WRAPPER.read_text())
    script.write_text(
        template.render(
            ansible_managed="managed",
            __health_config=str(tmp_path / "health.yaml"),
            __health_bundle=str(checker),
            health_tier_timeouts={"passive": 10, "prolog": 2, "epilog": 60},
            item={"key": tier, "value": tier},
        )
    )
    done = subprocess.run(
        ["/bin/sh", str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == exits[tier], done.stderr
    allowed = "job allowed" if tier == "prolog" else "node not drained"
    expected = (
        []
        if not why or done.returncode
        else [f"gpuforge-node: health {tier}: checker error: {why}: {allowed}"]
    )
    lines = done.stderr.splitlines()
    if fake == "killed":
        # The shell's own word for a child killed by a signal; slurmd logs both lines.
        assert lines[:1] == ["Killed"]
        lines = lines[1:]
    assert lines == expected
