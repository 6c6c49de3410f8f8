"""The compatibility matrix: its loader refuses bad rows, its rules refuse bad pairs of pins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.errors import InputError
from gpuforge.topology.compat import (
    MATRIX_FILE,
    VersionRange,
    judge,
    load_matrix,
    release,
    spec_pins,
)
from gpuforge.topology.load import load_spec

from ..conftest import LAB

LAB_PINS = {
    "nvidia_driver": "570.133.20",
    "fabricmanager": "570.133.20",
    "cuda": "12.8.1",
    "nccl": "2.26.2",
    "dcgm": "4.2.3",
    "slurm": "22.05.8",
    "doca_ofed": "2.9.1",
}


def test_release_reads_package_versions() -> None:
    assert release("1:4.2.3-1") == (4, 2, 3)
    assert release("2.26.2-1+cuda12.8") == (2, 26, 2)
    assert release("6.1.0-28-amd64") == (6, 1, 0)
    assert release("none") == ()


def test_range_bounds() -> None:
    r = VersionRange.parse(">=12.8.1,<12.9")
    assert r.contains("12.8.1")
    assert r.contains("12.8.93")
    assert not r.contains("12.8.0")
    assert not r.contains("12.9")
    with pytest.raises(ValueError, match="not a comparator"):
        VersionRange.parse("12.8+")


def test_every_row_has_a_public_source() -> None:
    for rule in load_matrix().rules:
        sources = [r.source for r in rule.rows] or [rule.source]
        assert all(s and s.startswith("https://") for s in sources), rule.name


def test_lab_pins_pass() -> None:
    pins = spec_pins(load_spec(LAB).versions)
    assert pins == LAB_PINS
    verdict = judge(pins)
    assert verdict.ok, verdict.conflicts
    assert verdict.unknown == ()


def test_rollback_pins_of_the_lab_mirror_pass() -> None:
    """The mirror's older driver and NCCL (lab/sim/build_packages.py) with the same CUDA."""
    older = LAB_PINS | {"nvidia_driver": "570.124.06", "fabricmanager": "570.124.06"}
    assert judge(older | {"nccl": "2.25.1", "cuda": "12.8.0", "dcgm": "4.1.1"}).ok
    assert judge(older).ok


@pytest.mark.parametrize(
    ("change", "rule", "both"),
    [
        (
            {"nvidia_driver": "570.86.10", "fabricmanager": "570.86.10"},
            "cuda-minimum-driver",
            ("nvidia_driver 570.86.10", "cuda 12.8.1"),
        ),
        (
            {"fabricmanager": "570.124.06"},
            "fabricmanager-equals-driver",
            ("fabricmanager 570.124.06", "nvidia_driver 570.133.20"),
        ),
        ({"cuda": "11.8.0"}, "nccl-cuda-major", ("cuda 11.8.0", "nccl 2.26.2")),
        (
            {"nvidia_driver": "470.256.02", "fabricmanager": "470.256.02", "cuda": "12.0.0"},
            "dcgm-minimum-driver",
            ("nvidia_driver 470.256.02", "dcgm 4.2.3"),
        ),
        ({"kernel": "5.10.0"}, "doca-kernel", ("kernel 5.10.0", "doca_ofed 2.9.1")),
        ({"pmix": "5.0.3"}, "slurm-pmix", ("pmix 5.0.3", "slurm 22.05.8")),
    ],
)
def test_incompatible_pair_names_both_and_the_rule(
    change: dict[str, str], rule: str, both: tuple[str, str]
) -> None:
    verdict = judge(LAB_PINS | change)
    assert not verdict.ok
    hit = [c for c in verdict.conflicts if c.rule == rule]
    assert hit, verdict.conflicts
    message = hit[0].message()
    assert f"rule {rule}" in message
    for text in both:
        assert text in message
    assert "https://" in message


def test_unknown_combination_is_a_warning() -> None:
    verdict = judge(LAB_PINS | {"cuda": "13.0.1"})
    assert [u.rule for u in verdict.unknown] == ["cuda-minimum-driver"]
    assert "does not know cuda 13.0.1" in verdict.unknown[0].message()


def _spec(tmp_path: Path, **versions: str) -> Path:
    data: Any = yaml.safe_load(Path(LAB).read_text(encoding="utf-8"))
    data["versions"].update(versions)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_topology_check_refuses_incompatible_pins(tmp_path: Path) -> None:
    spec = _spec(tmp_path, nvidia_driver="570.86.10")
    result = CliRunner().invoke(main, ["topology", "check", str(spec)])
    assert result.exit_code == 2
    assert "versions.nvidia_driver" in result.output
    assert "nvidia_driver 570.86.10 does not work with cuda 12.8.1" in result.output
    assert "rule cuda-minimum-driver demands nvidia_driver >= 570.124.06" in result.output
    assert "Traceback" not in result.output


def test_topology_check_warns_on_unknown_combination(tmp_path: Path) -> None:
    spec = _spec(tmp_path, nccl="2.28.3")
    result = CliRunner().invoke(main, ["topology", "check", str(spec)])
    assert result.exit_code == 0, result.output
    assert "warning:" in result.output
    assert "does not know nccl 2.28.3 (rule nccl-cuda-major" in result.output


def test_topology_check_lab_has_no_warning() -> None:
    result = CliRunner().invoke(main, ["topology", "check", str(LAB)])
    assert result.exit_code == 0
    assert "warning" not in result.output


def _matrix(tmp_path: Path, edit: Any) -> Path:
    data: Any = yaml.safe_load(MATRIX_FILE.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "compat.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _rule(data: Any, name: str) -> Any:
    return next(r for r in data["rules"] if r["name"] == name)


@pytest.mark.parametrize(
    ("edit", "where", "message"),
    [
        (
            lambda d: _rule(d, "cuda-minimum-driver")["rows"][3].update(min="latest"),
            "rules[1](cuda-minimum-driver).rows[3].min",
            "'latest' is not a version",
        ),
        (
            lambda d: _rule(d, "cuda-minimum-driver")["rows"][0].update(range="12.0"),
            "rows[0].range",
            "'12.0' is not a comparator",
        ),
        (
            lambda d: _rule(d, "nccl-cuda-major")["rows"][0].pop("source"),
            "rules[3](nccl-cuda-major).rows[0].source",
            "field required",
        ),
        (
            lambda d: _rule(d, "nccl-cuda-major")["rows"][0].update(source="http://x"),
            "rows[0].source",
            "not a public https:// URL",
        ),
        (lambda d: _rule(d, "slurm-pmix").update(subject="openmpi"), "subject", "Input should be"),
        (
            lambda d: _rule(d, "dcgm-minimum-driver")["rows"][0].update(allow=["1"]),
            "rules[2](dcgm-minimum-driver)",
            "rows[0].allow: not a field of a minimum rule",
        ),
        (lambda d: _rule(d, "doca-kernel").update(colour="blue"), "colour", "unknown field"),
    ],
)
def test_bad_matrix_row_names_file_and_key(
    tmp_path: Path, edit: Any, where: str, message: str
) -> None:
    path = _matrix(tmp_path, edit)
    with pytest.raises(InputError) as err:
        load_matrix(path)
    text = str(err.value)
    assert text.startswith(f"{path}: rules["), text
    assert where in text, text
    assert message in text, text


def test_matrix_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "compat.yaml"
    path.write_text("rules: [\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"compat.yaml:\d+: not valid YAML"):
        load_matrix(path)
