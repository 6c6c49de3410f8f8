"""gpuforge lab simulator: prints what NVIDIA and RDMA tools print, for hardware that is not there.

Lives only in the lab (lab/sim/ and the lab mirror's packages). Production code never imports it.
"""

from __future__ import annotations

__version__ = "0.2.0"

SIM_BANNER = "gpuforge lab simulator, not NVIDIA software"
SIM_BANNER_RDMA = "gpuforge lab simulator, not NVIDIA or linux-rdma software"
