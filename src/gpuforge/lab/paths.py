"""Where the lab keeps its inputs (``lab/``), build outputs (``build/``) and state (``.lab/``)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
LAB_DIR = REPO_ROOT / "lab"
CONTAINERS_CONF = LAB_DIR / "containers.conf"
IMAGE_RECIPE_DIR = LAB_DIR / "image"
PACKAGES_DIR = LAB_DIR / "packages"
SIM_DIR = LAB_DIR / "sim"
BUILD_DIR = REPO_ROOT / "build"
CACHE_DIR = BUILD_DIR / "cache"
MIRROR_DIR = BUILD_DIR / "lab-mirror"
GPG_DIR = BUILD_DIR / "lab-gpg"
STATE_ROOT = REPO_ROOT / ".lab"
