"""A drifted file is shown as a bounded unified diff against what its role rendered."""

from __future__ import annotations

import json
from pathlib import Path

from gpuforge.node import drift, filediff

from .test_drift import NCCL_CONF, FakeNode, _sha

RENDERED = "".join(f"line {i}\n" for i in range(200))


def _expected(directory: Path, content: dict[str, object]) -> None:
    (directory / "state").mkdir(parents=True)
    (directory / "state" / "nccl.json").write_text(
        json.dumps(
            {
                "schema": drift.EXPECTED_SCHEMA,
                "role": "nccl",
                "files": {"/etc/nccl.conf": _sha(NCCL_CONF), "/etc/munge/munge.key": _sha("k")},
                "content": content,
            }
        )
    )


def test_a_drifted_file_carries_its_diff_into_the_evidence(tmp_path: Path) -> None:
    _expected(
        tmp_path,
        {
            "/etc/nccl.conf": {"text": NCCL_CONF, "truncated": False},
            "/etc/munge/munge.key": {"omitted": "can hold a secret (its path)"},
        },
    )
    node = FakeNode()
    node.files["/etc/nccl.conf"] = "NCCL_IB_HCA=mlx5_0\nNCCL_DEBUG=INFO\n"
    node.files["/etc/munge/munge.key"] = "other"
    check = drift.run(tmp_path, node).check()
    assert check.status == "fail"
    evidence = check.evidence
    # the two sums first (as before), then each file's diff
    assert evidence.startswith("file /etc/munge/munge.key: desired 'sha256:")
    assert "--- /etc/nccl.conf (rendered by the role)\n+++ /etc/nccl.conf (on the node)" in evidence
    assert "-NCCL_IB_HCA=mlx5_0,mlx5_1\n+NCCL_IB_HCA=mlx5_0\n+NCCL_DEBUG=INFO" in evidence
    assert "(no diff for /etc/munge/munge.key: can hold a secret (its path))" in evidence
    assert "other" not in evidence


def test_no_content_recorded_says_so(tmp_path: Path) -> None:
    _expected(tmp_path, {})
    node = FakeNode()
    node.files["/etc/nccl.conf"] = "changed\n"
    evidence = drift.run(tmp_path, node).check().evidence
    assert "(no diff for /etc/nccl.conf: its rendered content is not recorded)" in evidence
    del node.files["/etc/nccl.conf"]
    path = tmp_path / "state" / "nccl.json"
    assert filediff.file_diff(path, "/etc/nccl.conf", node.read_text).startswith("(no diff")


def test_the_diff_is_bounded_and_says_where_it_was_cut() -> None:
    actual = RENDERED.replace("line ", "LINE ")
    text = filediff.bounded_diff("/etc/x.conf", RENDERED, actual)
    assert len(text) <= filediff.DIFF_MAX_CHARS + 60
    assert text.endswith(f"(... diff cut at {filediff.DIFF_MAX_CHARS} characters)")
    assert text.startswith("--- /etc/x.conf (rendered by the role)")


def test_a_cut_rendering_compares_the_same_head() -> None:
    head = RENDERED[:300]
    actual = RENDERED[:300].replace("line 3\n", "line three\n") + "tail that was never kept\n"
    text = filediff.bounded_diff("/etc/x.conf", head, actual, cut=True)
    assert "-line 3\n+line three" in text
    assert "tail that was never kept" not in text
    assert f"cut at {filediff.CONTENT_MAX_BYTES} bytes" in text


def test_same_lines_different_bytes() -> None:
    text = filediff.bounded_diff("/etc/x.conf", "a\nb\n", "a\r\nb\r\n")
    assert text.startswith(filediff.DIFF_HEADER + "/etc/x.conf")
    assert "same lines" in text
