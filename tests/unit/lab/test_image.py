"""gpuforge.lab.image: the recipe digest decides rebuilds; the recipe holds what a node needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.lab.image import packages, recipe_hash
from gpuforge.lab.paths import IMAGE_RECIPE_DIR


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    (tmp_path / "rootfs" / "etc").mkdir(parents=True)
    (tmp_path / "packages.txt").write_text("# base\nsystemd\n\nopenssh-server  # sshd\n")
    (tmp_path / "setup.sh").write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "rootfs" / "etc" / "motd").write_text("lab\n")
    return tmp_path


def test_hash_is_stable(recipe: Path) -> None:
    assert recipe_hash(recipe) == recipe_hash(recipe)
    assert len(recipe_hash(recipe)) == 12


def test_hash_changes_with_a_file_content(recipe: Path) -> None:
    before = recipe_hash(recipe)
    (recipe / "rootfs" / "etc" / "motd").write_text("lab2\n")
    assert recipe_hash(recipe) != before


def test_hash_changes_with_a_file_mode(recipe: Path) -> None:
    before = recipe_hash(recipe)
    (recipe / "setup.sh").chmod(0o755)
    assert recipe_hash(recipe) != before


def test_hash_changes_with_a_new_file(recipe: Path) -> None:
    before = recipe_hash(recipe)
    (recipe / "rootfs" / "etc" / "issue").write_text("x\n")
    assert recipe_hash(recipe) != before


def test_packages_drops_comments_and_blank_lines(recipe: Path) -> None:
    assert packages(recipe) == ["systemd", "openssh-server"]


@pytest.mark.parametrize(
    "name", ["systemd", "systemd-sysv", "openssh-server", "python3", "python3-apt", "sudo"]
)
def test_real_recipe_has(name: str) -> None:
    assert name in packages(IMAGE_RECIPE_DIR)
