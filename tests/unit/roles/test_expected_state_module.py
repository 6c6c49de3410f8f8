"""_common's desired-state module: the record it writes, idempotence, check mode, and the rendered
content it keeps for a drift diff (bounded, never for a file that can hold a secret)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from gpuforge.node import filediff

from ..conftest import REPO

MODULE = REPO / "roles/_common/library/gpuforge_expected_state.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuforge_expected_state", MODULE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(
    capsys: pytest.CaptureFixture[str], args: dict[str, Any], *, check: bool = False
) -> dict[str, Any]:
    module = _load()
    with patch_module_args({**args, "_ansible_check_mode": check}), pytest.raises(SystemExit):
        module.main()
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    etc = tmp_path / "etc"
    (etc / "munge").mkdir(parents=True)
    (etc / "ssh").mkdir()
    out = {
        "conf": etc / "gpu.conf",
        "big": etc / "big.conf",
        "munge": etc / "munge" / "munge.key",
        "hostkey": etc / "ssh" / "ssh_host_ed25519_key",
        "private": etc / "secret.conf",
        "binary": etc / "blob.bin",
    }
    out["conf"].write_text("a = 1\nb = 2\n")
    out["big"].write_text("é" * 40_000)  # 80,000 bytes of two-byte characters
    out["munge"].write_bytes(os.urandom(64))
    out["hostkey"].write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    out["private"].write_text("password = hunter2\n")
    out["private"].chmod(0o600)
    out["binary"].write_bytes(b"\x00\xff\xfe")
    for name in ("conf", "big", "binary"):
        out[name].chmod(0o644)
    return out


def test_content_is_kept_bounded_and_never_for_secrets(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    module = _load()
    got = module.contents([str(p) for p in files.values()] + [str(tmp_path / "gone")], 65536)
    assert got[str(files["conf"])] == {"text": "a = 1\nb = 2\n", "truncated": False}
    big = got[str(files["big"])]
    assert big["truncated"] is True
    assert big["text"] == "é" * 32_768  # cut at 64 kB, on a character boundary
    for secret in ("munge", "hostkey"):
        assert got[str(files[secret])] == {"omitted": "can hold a secret (its path)"}
    assert got[str(files["private"])] == {"omitted": "can hold a secret (mode 0600)"}
    assert got[str(files["binary"])] == {"omitted": "not UTF-8 text"}
    assert str(tmp_path / "gone") not in got
    assert "hunter2" not in json.dumps(got)


def test_secret_paths() -> None:
    module = _load()
    secrets = ["/etc/munge/anything", "/etc/munge/munge.key", "/root/.ssh/authorized_keys"]
    secrets += ["/etc/ssh/ssh_host_rsa_key", "/home/u/id_ed25519", "/etc/pki/tls/x.key"]
    for path in secrets:
        assert module.secret_reason(path, 0o100644), path
    for path in ("/etc/ssh/sshd_config", "/etc/ssh/ssh_host_rsa_key.pub", "/etc/gres.conf"):
        assert module.secret_reason(path, 0o100644) is None, path


def test_record_is_idempotent_and_check_mode_writes_nothing(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = {
        "dir": str(tmp_path / "state"),
        "role": "gpu",
        "files": [str(files["conf"]), str(files["munge"])],
        "sysctls": {"vm.swappiness": "1"},
    }
    dry = _run(capsys, args, check=True)
    assert dry["changed"] is True and not (tmp_path / "state").exists()
    first = _run(capsys, args)
    assert first["changed"] is True
    assert "content" not in first["record"]  # the play's output stays short
    record = json.loads((tmp_path / "state" / "gpu.json").read_text())
    assert record["schema"] == "gpuforge.expected/1"
    assert record["files"][str(files["conf"])].startswith("sha256:")
    assert record["content"][str(files["conf"])]["text"] == "a = 1\nb = 2\n"
    assert record["content"][str(files["munge"])] == {"omitted": "can hold a secret (its path)"}
    assert _run(capsys, args)["changed"] is False  # converged: changed=false
    assert _run(capsys, args, check=True)["changed"] is False
    files["conf"].write_text("a = 1\nb = 3\n")
    assert _run(capsys, args, check=True)["changed"] is True


def test_limit_matches_the_node_side() -> None:
    spec = _load().DOCUMENTATION
    assert f"default: {filediff.CONTENT_MAX_BYTES}," in spec


def test_the_holds_the_role_left_are_recorded_only_with_dpkg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # dpkg's ${db:Status-Abbrev}: "hi " held and installed (how apt_pinned.yml leaves its pins)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    listings = {
        "dpkg-query": "libnccl2\\t2.26.2-1\\thi \\nlibnccl-dev\\t2.26.2-1\\tii \\n",
        "rpm": "libnccl\\t2.26.2-1\\tii\\n",
    }
    for name, line in listings.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\nprintf '{line}'\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    args = {"dir": str(tmp_path / "state"), "role": "nccl",
            "packages": ["libnccl2", "libnccl-dev"]}  # fmt: skip
    _run(capsys, args)
    record = json.loads((tmp_path / "state" / "nccl.json").read_text())
    assert record["packages"] == {"libnccl2": "2.26.2-1", "libnccl-dev": "2.26.2-1"}
    assert record["holds"] == ["libnccl2"]
    # a role that holds nothing keeps the record it wrote before (no holds key, no change)
    (bin_dir / "dpkg-query").write_text("#!/bin/sh\nprintf 'libnccl2\\t2.26.2-1\\tii \\n'\n")
    _run(capsys, {**args, "role": "plain"})
    assert "holds" not in json.loads((tmp_path / "state" / "plain.json").read_text())
    _run(capsys, {**args, "role": "el", "package_manager": "rpm", "packages": ["libnccl"]})
    assert "holds" not in json.loads((tmp_path / "state" / "el.json").read_text())
