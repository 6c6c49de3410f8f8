"""The HTML report of a 1,000-node batch: failures first, warnings once, admitted nodes by rack."""

from __future__ import annotations

import re
import time

from gpuforge.validate.report import CHART_MAX_BARS, to_html
from gpuforge.validate.result import BatchSummary, CheckResult, Level, Status, Verdict

NODES = [f"gpu{i:04d}" for i in range(1, 1001)]
FAILED = {"gpu0137", "gpu0512", "gpu0999"}
HELD = {"gpu0007", "gpu0640"}
LONER = "gpu0300"  # the one node with a warning of its own
SYSCTL_WARNING = "/proc/sys is read-only on this host; /etc/sysctl.d sets them for boot"


def _results(node: str, i: int) -> list[CheckResult]:
    out = [
        CheckResult(node, check, Status.PASS, measured=1, expected=1, level=Level.QUICK)
        for check in ("gpu.count", "gpu.ecc_enabled", "software.driver", "fabric.nccl_conf")
    ]
    out += [
        CheckResult(node, f"fabric.port[{rail}]", Status.PASS, "Active", "Active")
        for rail in range(8)
    ]
    out.append(
        CheckResult(
            node,
            "fabric.sysctls",
            Status.WARN,
            measured="not applied",
            expected="applied",
            evidence="sysctl: permission denied on key 'net.core.rmem_max'",
            message=SYSCTL_WARNING,
        )
    )
    busbw = 470.0 + (i % 7)
    if node in FAILED:
        out.append(
            CheckResult(
                node,
                "gpu.ecc_uncorrectable",
                Status.FAIL,
                measured=3,
                expected=0,
                evidence=f"{node}: Volatile DRAM Uncorrectable 3",
            )
        )
        busbw = 230.0
    if node in HELD:
        out.append(
            CheckResult(node, "dcgm.diag", Status.ERROR, evidence="dcgmi: timed out after 900 s")
        )
    if node == LONER:
        out.append(
            CheckResult(node, "gpu.clocks", Status.WARN, 1500, 1980, message="clocks throttled")
        )
    out.append(CheckResult(node, "nccl.allreduce_nvlink", Status.PASS, busbw, 408.0))
    return out


def batch() -> BatchSummary:
    results = [r for i, node in enumerate(NODES) for r in _results(node, i)]
    placement = {
        node: {"su": i // 256 + 1, "rack": f"r{i // 8 + 1:03d}"} for i, node in enumerate(NODES)
    }
    meta = {"placement": placement, "floors": {"nccl.allreduce_nvlink": 408.0}}
    return BatchSummary.build(NODES, results, meta=meta)


def test_thousand_node_report_opens_with_its_failures() -> None:
    summary = batch()
    assert summary.counts() == {"admit": 995, "quarantine": 3, "hold": 2}

    start = time.process_time()  # CPU seconds: a loaded machine's wait is not ours
    page = to_html(summary)
    elapsed = time.process_time() - start

    assert elapsed < 2.0, f"rendering took {elapsed:.1f} CPU-s"
    assert len(page.encode()) < 300_000, f"{len(page.encode())} bytes"

    # The first section is the failures, quarantined before held, in the first few kilobytes.
    first = page.index("<h2")
    assert page[first:].startswith('<h2 id="failures">')
    rows = re.findall(r'<tr id="(gpu\d+)">', page)
    assert rows == ["gpu0137", "gpu0512", "gpu0999", "gpu0007", "gpu0640"]
    assert page.index('<tr id="gpu0640">') < 20_000
    assert "Volatile DRAM Uncorrectable 3" in page
    assert "dcgmi: timed out after 900 s" in page
    assert page.index('id="failures"') < page.index('id="warnings"') < page.index('id="admitted"')

    # A warning every node gives is said once, with the nodes as one range.
    assert page.count(SYSCTL_WARNING) == 1
    assert "gpu[0001-1000] (1000)" in page
    assert "clocks throttled" in page
    assert "gpu0300 (1)" in page

    # Admitted nodes: one line per rack, no row per node, no "skip" anywhere.
    admitted = page[page.index('id="admitted"') : page.index("<h2>Where</h2>")]
    assert admitted.count("<tr><td>") == 125  # 1,000 nodes, 8 per rack
    assert "gpu[0001-0006,0008] (7)" in admitted  # r001 without the held gpu0007
    assert ">skip<" not in page

    # The chart keeps the lowest bars, the failed nodes' first.
    assert f"lowest {CHART_MAX_BARS} of 1000" in page
    chart = page[page.index("8-GPU all_reduce") :]
    assert chart.index("gpu0137") < chart.index("gpu0001")


def test_admitted_nodes_without_placement_still_fold() -> None:
    nodes = ["a1", "a2", "a3"]
    results = [CheckResult(n, "gpu.count", Status.PASS, 8, 8) for n in nodes]
    summary = BatchSummary.build(nodes, results)
    assert [n.verdict for n in summary.nodes] == [Verdict.ADMIT] * 3
    page = to_html(summary)
    assert "a[1-3] (3)" in page
    assert '<tr id="' not in page


def test_validate_table_folds_admitted_nodes() -> None:
    import io  # noqa: PLC0415

    from rich.console import Console  # noqa: PLC0415

    from gpuforge.cli.validate import _table  # noqa: PLC0415

    out = io.StringIO()
    Console(file=out, width=200).print(_table(batch(), []))
    text = out.getvalue()
    lines = text.splitlines()
    assert len(lines) < 25, text
    for node in (*sorted(FAILED), *sorted(HELD)):
        assert node in text
    assert text.index("gpu0999") < text.index("gpu0007") < text.index("admit ")
    assert "(994)" in text  # every admitted node but the one with a warning of its own
    assert "gpu0300 " in text


def test_slurm_actions_are_grouped_with_their_reasons() -> None:
    actions = [
        {"node": f"gpu{i:04d}", "action": "resume", "changed": True, "reason": "", "detail": "ok"}
        for i in range(1, 998)
    ]
    actions += [
        {
            "node": n,
            "action": "drain",
            "changed": True,
            "reason": "gpuforge:gpu.xid:drain",
            "detail": "failed",
        }
        for n in ("gpu0998", "gpu0999")
    ]
    page = to_html(batch(), actions=actions)
    slurm = page[page.index("<h2>Slurm</h2>") : page.index('id="admitted"')]
    assert slurm.count("<tr><td>") == 2
    assert slurm.index("gpu[0998-0999] (2)") < slurm.index("gpu[0001-0997] (997)")
    assert "gpuforge:gpu.xid:drain" in slurm


def test_inconclusive_checks_without_values_say_none_of_them() -> None:
    page = to_html(batch())
    held = page[page.index('<tr id="gpu0007">') : page.index('<tr id="gpu0640">')]
    assert "dcgm.diag</summary>" in held
    assert "measured None" not in page
