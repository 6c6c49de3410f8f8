"""gpuforge.lab.mirror: a real signed repository built from package trees, rebuilt on change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.lab.mirror import ensure_mirror, ensure_signing_key, package_trees, source_hash

pytestmark = pytest.mark.slow


def make_package(root: Path, name: str, version: str) -> Path:
    tree = root / name
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "usr" / "share" / name).mkdir(parents=True)
    (tree / "usr" / "share" / name / "README").write_text(f"{name} {version}\n")
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: test <t@example.test>\nDescription: test package\n"
    )
    return tree


@pytest.fixture(scope="module")
def gpg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpg")
    ensure_signing_key(path)
    return path


@pytest.fixture
def sources(tmp_path: Path) -> tuple[Path, Path]:
    packages, sim = tmp_path / "packages", tmp_path / "sim"
    make_package(packages, "hello-a", "1.2.3-1")
    sim.mkdir()
    return packages, sim


def build(tmp_path: Path, gpg_dir: Path, sources: tuple[Path, Path]):
    return ensure_mirror(
        out_dir=tmp_path / "repo", gpg_dir=gpg_dir, packages_dir=sources[0], sim_dir=sources[1]
    )


def test_repository_is_signed_by_the_published_key(tmp_path, gpg_dir, sources) -> None:
    result = build(tmp_path, gpg_dir, sources)
    repo = result.path
    proc = subprocess.run(
        ["gpgv", "--keyring", str(repo / "gpuforge-lab.gpg"), str(repo / "dists/stable/InRelease")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "BEGIN PGP PUBLIC KEY BLOCK" in (repo / "gpuforge-lab.asc").read_text()


def test_index_lists_the_package_at_its_version(tmp_path, gpg_dir, sources) -> None:
    repo = build(tmp_path, gpg_dir, sources).path
    index = next((repo / "dists/stable/main").glob("binary-*/Packages")).read_text()
    fields = dict(line.split(": ", 1) for line in index.splitlines() if ": " in line)
    assert fields["Package"] == "hello-a"
    assert fields["Version"] == "1.2.3-1"
    assert fields["Filename"] == "pool/main/hello-a_1.2.3-1_all.deb"
    release = (repo / "dists/stable/Release").read_text()
    assert "Suite: stable" in release
    assert "Components: main" in release


def test_unchanged_sources_are_not_rebuilt(tmp_path, gpg_dir, sources) -> None:
    assert build(tmp_path, gpg_dir, sources).built
    assert not build(tmp_path, gpg_dir, sources).built


def test_a_changed_source_rebuilds_and_drops_the_old_package(tmp_path, gpg_dir, sources) -> None:
    build(tmp_path, gpg_dir, sources)
    control = sources[0] / "hello-a" / "DEBIAN" / "control"
    control.write_text(control.read_text().replace("1.2.3-1", "1.2.4-1"))
    result = build(tmp_path, gpg_dir, sources)
    assert result.built
    assert result.packages == ("hello-a_1.2.4-1_all.deb",)


def test_simulator_packages_are_included(tmp_path, gpg_dir, sources) -> None:
    script = sources[1] / "build_packages.py"
    script.write_text(
        "import argparse, pathlib\n"
        "p = argparse.ArgumentParser(); p.add_argument('--out'); a = p.parse_args()\n"
        "t = pathlib.Path(a.out) / 'nvidia-sim'; (t / 'DEBIAN').mkdir(parents=True)\n"
        "(t / 'DEBIAN' / 'control').write_text('Package: nvidia-sim\\nVersion: 570.1-1\\n"
        "Architecture: all\\nMaintainer: t <t@example.test>\\nDescription: sim\\n')\n"
    )
    result = build(tmp_path, gpg_dir, sources)
    assert result.packages == ("hello-a_1.2.3-1_all.deb", "nvidia-sim_570.1-1_all.deb")


def test_two_sources_of_one_package_version_are_refused(tmp_path, gpg_dir, sources) -> None:
    make_package(sources[0] / "dup", "hello-a", "1.2.3-1")
    with pytest.raises(InputError, match=r"two package sources build hello-a 1\.2\.3-1"):
        build(tmp_path, gpg_dir, sources)


def test_no_sources_is_an_input_error(tmp_path, gpg_dir) -> None:
    with pytest.raises(InputError, match="no package sources"):
        ensure_mirror(
            out_dir=tmp_path / "r", gpg_dir=gpg_dir, packages_dir=tmp_path, sim_dir=tmp_path / "s"
        )


def test_package_trees_skip_caches(tmp_path: Path) -> None:
    make_package(tmp_path, "a", "1")
    make_package(tmp_path / "__pycache__", "b", "1")
    assert package_trees(tmp_path) == [tmp_path / "a"]


def test_source_hash_follows_content(sources) -> None:
    before = source_hash(*sources)
    (sources[0] / "hello-a" / "usr" / "share" / "hello-a" / "README").write_text("changed\n")
    assert source_hash(*sources) != before
