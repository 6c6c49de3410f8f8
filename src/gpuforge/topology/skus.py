"""The GPU SKU catalogue: what every layer knows of a GPU model, from ``data/skus.json``.

One entry per model: the spellings a topology's ``gpu_model`` may use, its board power, and the
published figures the acceptance floors are fractions of (with their sources). The spec check
(:mod:`gpuforge.topology.spec_rules`), the validation floors (:mod:`gpuforge.validate.thresholds`),
the power recording rules (:mod:`gpuforge.monitoring.rules`) and the lab simulator
(``lab/sim/gpuforge_sim/skus.py``) all read it. The simulator runs on lab nodes with the
standard library alone and without gpuforge, so the catalogue is data (JSON), not code: the
simulator's package carries a copy of the file (``lab/sim/build_packages.py``), and a unit test
holds the simulator's reading of it to this one's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpuforge.errors import InputError

CATALOGUE_FILE = Path(__file__).parent / "data" / "skus.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Validation:
    """The figures the acceptance floors of a SKU are fractions of. Bandwidths in GB/s."""

    gpus: int
    #: Published large-message (>= 1 GiB) 8-GPU single-node all_reduce busbw, GB/s.
    nvlink_allreduce_ref_gbs: float
    #: Where ``nvlink_allreduce_ref_gbs`` comes from.
    source: str
    #: PCIe generation and width every GPU's link must train to (the SKU's host interface).
    pcie_gen: int
    pcie_width: int
    #: Datasheet FP32 (non-tensor) TFLOP/s of one GPU; None = no gpu-burn floor.
    fp32_tflops: float | None
    fp32_source: str


@dataclass(frozen=True)
class Sku:
    """One GPU model of the catalogue."""

    key: str
    #: Other spellings of ``key`` in a topology's ``gpu_model``.
    names: tuple[str, ...]
    architecture: str
    #: Maximum board power of one GPU, watts, and where the figure comes from.
    power_w: float
    power_source: str
    #: The name nvidia-smi prints (from real captures), where known.
    product_name: str | None = None
    #: The validation figures: this SKU's own, or those of the entry it is ``validated_as``.
    validation: Validation | None = None
    validated_as: str | None = None


@cache
def catalogue() -> Mapping[str, Sku]:
    """Every SKU by key, in the file's order."""
    return parse_catalogue(json.loads(CATALOGUE_FILE.read_text(encoding="utf-8")))


def parse_catalogue(doc: Mapping[str, Any]) -> dict[str, Sku]:
    """The catalogue of a ``skus.json`` document; InputError when it is malformed."""
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"SKU catalogue: schema_version is not {SCHEMA_VERSION}")
    out: dict[str, Sku] = {}
    names: dict[str, str] = {}
    for raw in doc.get("skus", []):
        try:
            val = raw.get("validation")
            sku = Sku(
                key=str(raw["key"]),
                names=tuple(str(n) for n in raw.get("names", [])),
                architecture=str(raw["architecture"]),
                power_w=float(raw["power_w"]),
                power_source=str(raw["power_source"]),
                product_name=raw.get("product_name"),
                validation=None
                if val is None
                else Validation(
                    gpus=int(val["gpus"]),
                    nvlink_allreduce_ref_gbs=float(val["nvlink_allreduce_ref_gbs"]),
                    source=str(val["source"]),
                    pcie_gen=int(val["pcie_gen"]),
                    pcie_width=int(val["pcie_width"]),
                    fp32_tflops=None if val["fp32_tflops"] is None else float(val["fp32_tflops"]),
                    fp32_source=str(val["fp32_source"]),
                ),
                validated_as=raw.get("validated_as"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"SKU catalogue: entry {raw!r}: {exc}") from exc
        for name in (sku.key, *sku.names):
            if name in names:
                raise InputError(f"SKU catalogue: {name!r} names {names[name]} and {sku.key}")
            names[name] = sku.key
        out[sku.key] = sku
    for sku in out.values():
        target = out.get(sku.validated_as or "")
        if sku.validated_as and (target is None or target.validation is None):
            raise InputError(f"SKU catalogue: {sku.key} is validated as unknown {sku.validated_as}")
    return out


def lookup(name: str) -> Sku | None:
    """The SKU a ``gpu_model`` spells exactly (its key or one of its names), else None."""
    return _by_name().get(name)


@cache
def _by_name() -> Mapping[str, Sku]:
    return {n: sku for sku in catalogue().values() for n in (sku.key, *sku.names)}


def validated(model: str) -> Sku | None:
    """The SKU whose validation figures judge GPUs of ``model``, else None.

    Its exact spelling first (an entry ``validated_as`` another lends that one), then, for a
    spelling the catalogue lacks, the first validated SKU of the same family (the name's part
    before the first ``-``) when the name says SXM: ``H100-SXM5-94GB`` is judged as an H100 SXM.
    """
    sku = lookup(model)
    if sku is not None and sku.validated_as:
        sku = catalogue()[sku.validated_as]
    if sku is not None:
        return sku if sku.validation is not None else None
    upper = model.upper()
    for candidate in catalogue().values():
        if (
            candidate.validation is not None
            and upper.startswith(candidate.key.split("-")[0])
            and "SXM" in upper
        ):
            return candidate
    return None


def validated_keys() -> list[str]:
    """The keys of the SKUs that carry validation figures, in the file's order."""
    return [k for k, sku in catalogue().items() if sku.validation is not None]


def power_w(model: str | None) -> float | None:
    """Maximum board power of one GPU of ``model`` (watts): its entry's, else that of the SKU
    that validates it; None when the catalogue does not know it."""
    sku = lookup(model or "") or validated(model or "")
    return None if sku is None else sku.power_w
