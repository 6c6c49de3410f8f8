"""gpuforge: build and keep healthy GPU clusters from one topology spec."""

from __future__ import annotations

__version__ = "0.1.0"
