"""Fuzzing every parser: whatever the text, the answer is a typed result or a ParseError."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuforge.validate.parsers import PARSERS, ParseError, to_jsonable

from ._real import KIND_OF, real_text

FUZZ = settings(
    # GPUFORGE_FUZZ_EXAMPLES=5000 runs a longer, random (not derandomized) search.
    max_examples=int(os.environ.get("GPUFORGE_FUZZ_EXAMPLES", "150")),
    deadline=None if "GPUFORGE_FUZZ_EXAMPLES" in os.environ else 2000,
    derandomize="GPUFORGE_FUZZ_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SAMPLES = sorted((path, kind) for path, kind in KIND_OF.items() if kind is not None)
TEXTS = {path: real_text(path) for path, _ in SAMPLES}
KINDS = sorted(PARSERS)


def _parse(kind: str, text: str) -> None:
    try:
        result = PARSERS[kind](text)
    except ParseError as exc:
        assert len(str(exc)) < 2000
        return
    to_jsonable(result)


@st.composite
def _mangled(draw: st.DrawFn) -> tuple[str, str]:
    """A real capture, cut, spliced with another capture's lines, or with junk inside."""
    path, kind = draw(st.sampled_from(SAMPLES))
    lines = TEXTS[path].splitlines(keepends=True)
    how = draw(st.sampled_from(["cut", "drop", "splice", "junk", "other-kind"]))
    if how == "cut":
        text = TEXTS[path][: draw(st.integers(0, len(TEXTS[path])))]
    elif how == "drop" and lines:
        start = draw(st.integers(0, len(lines) - 1))
        text = "".join(lines[:start] + lines[start + draw(st.integers(1, 20)) :])
    elif how == "splice":
        other = TEXTS[draw(st.sampled_from(SAMPLES))[0]].splitlines(keepends=True)
        at = draw(st.integers(0, len(lines)))
        text = "".join(lines[:at] + other[: draw(st.integers(0, 30))] + lines[at:])
    elif how == "junk":
        at = draw(st.integers(0, len(TEXTS[path])))
        junk = draw(st.text(max_size=60))
        text = TEXTS[path][:at] + junk + TEXTS[path][at:]
    else:
        kind = draw(st.sampled_from(KINDS))
        text = TEXTS[path]
    return kind, text


@FUZZ
@given(_mangled())
def test_mangled_real_captures(case: tuple[str, str]) -> None:
    _parse(*case)


@FUZZ
@given(st.sampled_from(KINDS), st.text(max_size=400))
def test_random_text(kind: str, text: str) -> None:
    _parse(kind, text)


@FUZZ
@given(
    st.sampled_from(KINDS),
    st.lists(
        st.sampled_from(
            [
                "GPU 0: X (UUID: GPU-1)\n",
                "\t Link 0: 25 GB/s\n",
                "hca_id:\tmlx5_0\n",
                "\tport:\t1\n",
                "\t\tstate:\tPORT_ACTIVE (4)\n",
                "CA 'mlx5_0'\n",
                "\tPort 1:\n",
                "\t\tRate: 400\n",
                "|  Diagnostic  |  Result  |\n",
                "+-----+-----+\n",
                "| Deployment | Pass |\n",
                "GPUs:\n",
                "    gpuId 0:\n",
                "        U U D X _\n",
                "NvSwitches:\n",
                "\tGPU0\tGPU1\tCPU Affinity\n",
                "GPU0\t X \tNV18\t0-1\n",
                "Legend:\n",
                "#  size  count  type  redop  root\n",
                "#  size  count  type  redop  root  time  algbw  busbw #wrong\n",
                "  8  2  float  sum  -1  1.0  0.1  0.1  0  1.0  0.1  0.1  0\n",
                "# Avg bus bandwidth    : 1.5\n",
                "NVRM: Xid (PCI:0000:01:00): 79, pid=1\n",
                "==============NVSMI LOG==============\n",
                "GPU 00000000:01:00.0\n",
                "    Product Name : H100\n",
                "index, name\n",
                "0, H100\n",
                "{",
                "}",
                "\n",
                "ibv_devinfo\n",
                "   0  100  Gflop/s\n",
                "\x00",
                "\ufeff",
            ]
        ),
        max_size=40,
    ).map("".join),
)
def test_line_soup(kind: str, text: str) -> None:
    _parse(kind, text)


def test_every_kind_has_real_captures_to_mangle() -> None:
    assert {kind for _, kind in SAMPLES} == set(KINDS)
