"""The SKU catalogue: one file the spec check, the floors, monitoring and the simulator read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.monitoring import rules as monitoring_rules
from gpuforge.topology import skus
from gpuforge.validate import thresholds

from ..conftest import REPO

SIM = REPO / "lab" / "sim"


def test_every_figure_has_a_source() -> None:
    for sku in skus.catalogue().values():
        assert sku.power_source, sku.key
        if sku.validation is not None:
            assert sku.validation.source, sku.key
            assert sku.validation.fp32_source or sku.validation.fp32_tflops is None, sku.key


def test_the_floors_are_the_catalogue_s_validated_skus() -> None:
    assert list(thresholds.SKUS) == skus.validated_keys()
    for key, floor in thresholds.SKUS.items():
        val = skus.catalogue()[key].validation
        assert val is not None
        assert floor.nvlink_allreduce_ref_gbs == val.nvlink_allreduce_ref_gbs
        assert (floor.pcie_gen, floor.pcie_width) == (val.pcie_gen, val.pcie_width)


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("H100", "H100-SXM-80GB"),
        ("H100-SXM5-80GB", "H100-SXM-80GB"),
        ("H100-SXM-94GB", "H100-SXM-80GB"),  # an unlisted SXM spelling of a known family
        ("A100-SXM4-80GB", "A100-SXM-80GB"),
        ("GB200", "B200-SXM-180GB"),  # validated as the B200 it carries
        ("H100-PCIE-80GB", None),  # in the catalogue for its power, no validation figures
        ("L40S", None),
        ("T4", None),
    ],
)
def test_a_model_is_validated_as_one_sku(model: str, key: str | None) -> None:
    sku = skus.validated(model)
    assert (sku.key if sku else None) == key
    if key is None:
        with pytest.raises(InputError):
            thresholds.for_sku(model)
    else:
        assert thresholds.for_sku(model).sku == key


@pytest.mark.parametrize(
    ("model", "watts"),
    [("H100-SXM-80GB", 700), ("A100-SXM", 400), ("B200-SXM", 1000), ("GB200", 1200), ("T4", 700)],
)
def test_monitoring_power_is_the_catalogue_s(model: str, watts: float) -> None:
    assert monitoring_rules._gpu_power_w(model) == watts


def test_a_name_naming_two_skus_is_refused() -> None:
    doc = json.loads(skus.CATALOGUE_FILE.read_text())
    doc["skus"][1]["names"].append("H100")
    with pytest.raises(InputError, match="'H100' names"):
        skus.parse_catalogue(doc)


def test_the_simulator_reads_the_same_catalogue() -> None:
    from gpuforge_sim import skus as sim_skus  # noqa: PLC0415

    raw = {s["key"]: s for s in json.loads(skus.CATALOGUE_FILE.read_text())["skus"]}
    assert sim_skus.catalogue() == raw
    for key, sim in sim_skus.SKUS.items():
        sku = skus.catalogue()[key]
        assert sku.validation is not None
        assert (sim.product_name, sim.architecture) == (sku.product_name, sku.architecture)
        assert (sim.power_limit_w, sim.pcie_gen) == (sku.power_w, sku.validation.pcie_gen)


def test_the_node_package_carries_the_catalogue_and_runs_without_gpuforge(tmp_path: Path) -> None:
    """On a node the simulator is its package's files alone, run with ``python3 -SE``."""
    out = tmp_path / "pkgs"
    subprocess.run(
        [sys.executable, "-S", str(SIM / "build_packages.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (common,) = out.glob("gpuforge-sim-common_*")
    lib = common / "usr" / "lib" / "gpuforge-sim"
    assert (lib / "gpuforge_sim" / "skus.json").read_bytes() == skus.CATALOGUE_FILE.read_bytes()
    node = tmp_path / "node"
    shutil.copytree(lib, node)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import gpuforge_sim.skus as s; "
        "print(s.resolve_sku('A100-SXM4-80GB').key, "
        "next(p for p in s.CATALOGUE_PATHS if p.is_file()))"
    )
    done = subprocess.run(
        [sys.executable, "-SE", "-c", probe, str(node)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.stdout.split() == ["A100-SXM-80GB", str(node / "gpuforge_sim" / "skus.json")]
