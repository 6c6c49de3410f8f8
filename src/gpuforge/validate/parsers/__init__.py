"""Parsers for the real output of GPU and InfiniBand tools: pure functions, text to typed values.

Each module exposes ``parse(text: str) -> <frozen dataclass>`` and raises :class:`ParseError`
(an :class:`~gpuforge.errors.InputError`, exit code 2) naming the line it could not read. Output
that is readable but incomplete (cut, elided, a GPU missing) parses, and says what is missing in
the result's ``warnings``. :data:`PARSERS` maps the ``gpuforge parse`` KIND names to the parsers;
:func:`to_jsonable` turns any result into JSON-ready data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuforge.validate.parsers import (
    dcgmi,
    dcgmi_nvlink,
    gpu_burn,
    ib_write_bw,
    ibstat,
    ibv_devinfo,
    nccl_tests,
    nvidia_smi_csv,
    nvidia_smi_q,
    nvidia_smi_topo,
    nvidia_smi_xml,
    nvlink,
    xid,
)
from gpuforge.validate.parsers._common import ParseError, to_jsonable

PARSERS: dict[str, Callable[[str], Any]] = {
    "nccl-tests": nccl_tests.parse,
    "nvidia-smi-xml": nvidia_smi_xml.parse,
    "nvidia-smi-q": nvidia_smi_q.parse,
    "nvidia-smi-csv": nvidia_smi_csv.parse,
    "nvidia-smi-topo": nvidia_smi_topo.parse,
    "nvlink": nvlink.parse,
    "dcgmi": dcgmi.parse,
    "dcgmi-nvlink": dcgmi_nvlink.parse,
    "ibstat": ibstat.parse,
    "ibv_devinfo": ibv_devinfo.parse,
    "ib_write_bw": ib_write_bw.parse,
    "gpu-burn": gpu_burn.parse,
    "xid": xid.parse,
}

__all__ = ["PARSERS", "ParseError", "to_jsonable"]
