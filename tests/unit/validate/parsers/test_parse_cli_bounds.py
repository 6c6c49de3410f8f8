"""``gpuforge parse`` text output stays readable and quick on a huge capture."""

from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner

from gpuforge.cli import main

from ._real import real_text

KERNEL = "kernel/gpud-dmesg-decode-iso-xid13-xid43.txt"


def test_huge_kernel_log_is_summarized_in_text_mode(tmp_path: Path) -> None:
    sample = real_text(KERNEL)
    log = tmp_path / "kern.log"
    log.write_text(sample * 10)  # 1.2 MB, some 6,000 Xid lines
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["parse", "xid", str(log)])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output[-2000:]
    assert "the first 50 shown; --json for all" in result.output
    assert "xid_counts: 13=" in result.output
    assert result.output.count("\n") < 400
    assert elapsed < 10
