"""Where the lab keeps its inputs (``lab/``), build outputs (``build/``) and state (``.lab/``)."""

from __future__ import annotations

from gpuforge.resources import project_path, work_dir

LAB_DIR = project_path("lab")
CONTAINERS_CONF = LAB_DIR / "containers.conf"
IMAGE_RECIPE_DIR = LAB_DIR / "image"
PACKAGES_DIR = LAB_DIR / "packages"
SIM_DIR = LAB_DIR / "sim"
BUILD_DIR = work_dir() / "build"
CACHE_DIR = BUILD_DIR / "cache"
MIRROR_DIR = BUILD_DIR / "lab-mirror"
GPG_DIR = BUILD_DIR / "lab-gpg"
STATE_ROOT = work_dir() / ".lab"
