from __future__ import annotations

from gpuforge.cli import main

main()
