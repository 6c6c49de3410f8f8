"""The nightly ranking's drain policy: a small YAML file (docs/predictive.md, "Policy").

::

    # /etc/gpuforge/predict.yaml
    version: 1
    window: 7d            # look-back of the ranking
    horizon: 7d           # what the score is a probability over
    drain:
      threshold: 0.6      # the lowest calibrated score drained
      max_per_night: 2    # predicted drains per 24 h, counted in the admission record
      idle_only: true     # leave nodes with a running job (taken at a later night)
      shadow: true        # decide and record, change nothing (start here)
      max_fraction: 0.01  # the circuit breaker's share of the fleet

Every key is optional (the defaults are above). It is read the way ``health.yaml`` is
(:mod:`gpuforge.node.config`): an unknown key, a wrong type or a value out of range is refused
as ``FILE:LINE: key.path: problem`` (:class:`~gpuforge.errors.InputError`, exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuforge.errors import InputError
from gpuforge.node.config import _Reader, read_yaml

#: Where the services host keeps it.
DEFAULT_PATH = Path("/etc/gpuforge/predict.yaml")
_TOP = ("version", "window", "horizon", "drain")
_DRAIN = ("threshold", "max_per_night", "idle_only", "shadow", "max_fraction")
_DURATION = re.compile(r"^(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<unit>[smhd])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class DrainPolicy:
    """What the nightly ranking may drain."""

    threshold: float = 0.6
    max_per_night: int = 2
    idle_only: bool = True
    shadow: bool = True
    max_fraction: float = 0.01


@dataclass(frozen=True)
class PredictPolicy:
    """A loaded, validated policy file."""

    window_s: float = 7 * 86400.0
    horizon_s: float = 7 * 86400.0
    drain: DrainPolicy = DrainPolicy()
    source: str = "(defaults)"


def parse_duration(text: str, what: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` in seconds; InputError naming ``what`` otherwise."""
    match = _DURATION.match(text.strip())
    if match is None or float(match["n"]) <= 0:
        raise InputError(f"{what}: {text!r} is not a duration like 7d, 12h, 30m or 90s")
    return float(match["n"]) * _UNITS[match["unit"]]


def _duration(r: _Reader, data: Mapping[str, Any], key: str, default: float) -> float:
    if key not in data:
        return default
    value = data[key]
    match = _DURATION.match(value.strip()) if isinstance(value, str) else None
    if match is None or float(match["n"]) <= 0:
        raise r.fail(key, "must be a duration like 7d, 12h, 30m or 90s (> 0)")
    return float(match["n"]) * _UNITS[match["unit"]]


def parse(text: str, source: str = "predict.yaml") -> PredictPolicy:
    """Validate a policy file's ``text``; ``source`` names the file in errors."""
    data, r = read_yaml(text, source)
    top = r.mapping(data, "", _TOP)
    version = r.integer(top, "version", "", 1, minimum=1)
    if version != 1:
        raise r.fail("version", "must be 1 (the only version of this file)")
    raw = r.mapping(top.get("drain"), "drain", _DRAIN)
    defaults = DrainPolicy()
    threshold = r.number(raw, "threshold", "drain", defaults.threshold, positive=True)
    fraction = r.number(raw, "max_fraction", "drain", defaults.max_fraction, positive=True)
    if threshold is not None and threshold > 1:
        raise r.fail("drain.threshold", "must be a score in (0, 1]")
    if fraction is not None and fraction > 1:
        raise r.fail("drain.max_fraction", "must be a share in (0, 1]")
    per_night = r.integer(raw, "max_per_night", "drain", defaults.max_per_night, minimum=0)
    drain = DrainPolicy(
        threshold=defaults.threshold if threshold is None else threshold,
        max_per_night=defaults.max_per_night if per_night is None else per_night,
        idle_only=r.flag(raw, "idle_only", "drain", defaults.idle_only),
        shadow=r.flag(raw, "shadow", "drain", defaults.shadow),
        max_fraction=defaults.max_fraction if fraction is None else fraction,
    )
    return PredictPolicy(
        window_s=_duration(r, top, "window", 7 * 86400.0),
        horizon_s=_duration(r, top, "horizon", 7 * 86400.0),
        drain=drain,
        source=source,
    )


def load(path: Path = DEFAULT_PATH) -> PredictPolicy:
    """Read and validate the policy file at ``path``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    return parse(text, str(path))
