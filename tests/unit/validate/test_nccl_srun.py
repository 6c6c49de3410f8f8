"""SrunCollective: what an srun'd nccl-tests run measured, and when it measured nothing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from tests.unit.conftest import real_fixture

from gpuforge.command import CommandResult
from gpuforge.validate.nccl import SrunCollective

CAPTURE = "nccl-tests/ocihowto-h200-2node-16gpu-all_reduce_perf.txt"


@dataclass
class OneAnswer:
    """A controller that answers every command with the same output and exit status."""

    stdout: str
    rc: int = 0

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        return CommandResult(host=host, command=command, rc=self.rc, stdout=self.stdout)


def _cut_before_summary(text: str) -> str:
    return text[: text.index("# Avg bus bandwidth")]


def test_a_complete_run_measures_its_largest_size() -> None:
    text = real_fixture(CAPTURE)
    busbw = SrunCollective(OneAnswer(text), "ctl01")(("gpu01", "gpu02"))
    assert busbw > 400


@pytest.mark.parametrize(
    ("change", "rc"),
    [
        pytest.param(_cut_before_summary, 0, id="cut before the summary"),
        pytest.param(lambda t: t, 1, id="non-zero exit"),
    ],
)
def test_a_run_that_did_not_finish_measures_nothing(change: object, rc: int) -> None:
    text = real_fixture(CAPTURE)
    assert callable(change)
    busbw = SrunCollective(OneAnswer(change(text), rc), "ctl01")(("gpu01", "gpu02"))
    assert busbw == 0.0
