"""The lab package mirror: a signed apt repository built from ``lab/packages/`` and ``lab/sim/``.

Layout of ``build/lab-mirror/`` (served over HTTP as ``http://<lab>-mirror/``)::

    dists/stable/{Release,Release.gpg,InRelease}
    dists/stable/main/binary-<arch>/{Packages,Packages.gz}
    pool/main/<name>_<version>_<arch>.deb
    gpuforge-lab.asc      the signing key, armored
    gpuforge-lab.gpg      the same key as a binary keyring, for ``signed-by=``

The signing key is generated once into ``build/lab-gpg/`` (no passphrase: it only vouches for
packages built on this machine) and reused.  The repository is rebuilt only when its sources
change: a digest over ``lab/packages/`` and ``lab/sim/`` is kept in ``.source-hash``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuforge.errors import InputError, OperationError
from gpuforge.lab.paths import BUILD_DIR, GPG_DIR, MIRROR_DIR, PACKAGES_DIR, SIM_DIR
from gpuforge.lab.proc import file_lock, run_cmd

SUITE = "stable"
COMPONENT = "main"
KEY_UID = "gpuforge lab mirror <lab-mirror@gpuforge.test>"
KEY_ASC = "gpuforge-lab.asc"
KEY_GPG = "gpuforge-lab.gpg"
HASH_FILE = ".source-hash"
#: Bumped when the build steps change in a way the sources do not show.
BUILDER_VERSION = "1"

SIM_BUILD_TIMEOUT = 600.0
DPKG_TIMEOUT = 300.0
GPG_TIMEOUT = 120.0
_IGNORED_PARTS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})


@dataclass(frozen=True)
class MirrorResult:
    """Outcome of :func:`ensure_mirror`."""

    path: Path
    built: bool
    packages: tuple[str, ...]
    seconds: float


def source_hash(packages_dir: Path = PACKAGES_DIR, sim_dir: Path = SIM_DIR) -> str:
    """Digest over every source file of the mirror (paths, modes, contents)."""
    digest = hashlib.sha256(f"{BUILDER_VERSION}\0{SUITE}\0{COMPONENT}\0".encode())
    for base in (packages_dir, sim_dir):
        digest.update(f"{base.name}\0".encode())
        for path in _source_files(base):
            rel = path.relative_to(base).as_posix()
            digest.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def package_trees(root: Path) -> list[Path]:
    """Directories under ``root`` that are package trees (they hold ``DEBIAN/control``)."""
    if not root.is_dir():
        return []
    trees = {
        p.parent.parent
        for p in root.rglob("control")
        if p.parent.name == "DEBIAN" and not _IGNORED_PARTS.intersection(p.parts)
    }
    return sorted(trees)


def ensure_mirror(
    *,
    force: bool = False,
    out_dir: Path = MIRROR_DIR,
    gpg_dir: Path = GPG_DIR,
    packages_dir: Path = PACKAGES_DIR,
    sim_dir: Path = SIM_DIR,
    progress: Callable[[str], None] | None = None,
) -> MirrorResult:
    """Build (or reuse) the signed repository in ``out_dir``; returns what it holds."""
    say = progress or _quiet
    started = time.monotonic()
    with file_lock(BUILD_DIR / "locks" / "lab-mirror.lock"):
        digest = source_hash(packages_dir, sim_dir)
        hash_file = out_dir / HASH_FILE
        current = hash_file.read_text().strip() if hash_file.is_file() else ""
        if not force and current == digest and (out_dir / "dists" / SUITE / "InRelease").is_file():
            return MirrorResult(out_dir, False, _pool_names(out_dir), time.monotonic() - started)
        fingerprint = ensure_signing_key(gpg_dir)
        try:
            built = _build(
                fingerprint,
                digest=digest,
                out_dir=out_dir,
                gpg_dir=gpg_dir,
                packages_dir=packages_dir,
                sim_dir=sim_dir,
                say=say,
            )
        finally:
            _stop_agent(gpg_dir)
    return MirrorResult(out_dir, built, _pool_names(out_dir), time.monotonic() - started)


def _build(
    fingerprint: str,
    *,
    digest: str,
    out_dir: Path,
    gpg_dir: Path,
    packages_dir: Path,
    sim_dir: Path,
    say: Callable[[str], None],
) -> bool:
    (BUILD_DIR / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mirror-", dir=BUILD_DIR / "tmp") as tmp:
        scratch = Path(tmp)
        staging = scratch / "repo"
        pool = staging / "pool" / COMPONENT
        pool.mkdir(parents=True)
        trees = package_trees(packages_dir)
        debs: list[Path] = []
        sim_script = sim_dir / "build_packages.py"
        if sim_script.is_file():
            sim_out = scratch / "sim"
            sim_out.mkdir()
            say(f"building simulator packages with {sim_script.name}")
            run_cmd(
                [sys.executable, str(sim_script), "--out", str(sim_out)],
                timeout=SIM_BUILD_TIMEOUT,
                cwd=sim_dir,
            )
            trees += package_trees(sim_out)
            debs += sorted(sim_out.rglob("*.deb"))
        if not trees and not debs:
            raise InputError(f"no package sources under {packages_dir} or {sim_dir}")
        debs += [_build_deb(tree, scratch / "trees") for tree in trees]
        for deb in debs:
            _add_to_pool(deb, pool)
        say(f"indexing {len(debs)} packages")
        _index(staging)
        _sign(staging, gpg_dir, fingerprint)
        _export_key(staging, gpg_dir, fingerprint)
        (staging / HASH_FILE).write_text(digest + "\n")
        _publish(staging, out_dir)
    return True


def _stop_agent(gpg_dir: Path) -> None:
    """Stop the gpg-agent that signing started, so no daemon outlives the build."""
    run_cmd(
        ["gpgconf", "--kill", "gpg-agent"],
        timeout=GPG_TIMEOUT,
        env={"GNUPGHOME": str(gpg_dir), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        check=False,
    )


def ensure_signing_key(gpg_dir: Path = GPG_DIR) -> str:
    """The fingerprint of the lab signing key, generating the key on first use."""
    gpg_dir.mkdir(parents=True, exist_ok=True)
    gpg_dir.chmod(0o700)
    fingerprint = _fingerprint(gpg_dir)
    if fingerprint:
        return fingerprint
    _gpg(
        gpg_dir,
        ["--passphrase", "", "--quick-generate-key", KEY_UID, "ed25519", "sign", "never"],
    )
    fingerprint = _fingerprint(gpg_dir)
    _stop_agent(gpg_dir)
    if not fingerprint:
        raise OperationError(f"gpg created no key in {gpg_dir}")
    return fingerprint


def _fingerprint(gpg_dir: Path) -> str:
    out = _gpg(gpg_dir, ["--with-colons", "--list-secret-keys", KEY_UID], check=False)
    for line in out.splitlines():
        fields = line.split(":")
        if fields[0] == "fpr" and len(fields) > 9:
            return fields[9]
    return ""


def _gpg(gpg_dir: Path, args: list[str], *, check: bool = True) -> str:
    env = {
        "GNUPGHOME": str(gpg_dir),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C",
    }
    proc = run_cmd(
        ["gpg", "--batch", "--yes", "--no-tty", "--pinentry-mode", "loopback", *args],
        timeout=GPG_TIMEOUT,
        env=env,
        check=check,
    )
    return proc.stdout.decode("utf-8", "replace")


def _build_deb(tree: Path, work: Path) -> Path:
    """Build one package tree; the copy normalises permissions dpkg-deb insists on."""
    work.mkdir(parents=True, exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix="tree-", dir=work)) / tree.name
    shutil.copytree(tree, copy, ignore=shutil.ignore_patterns(*_IGNORED_PARTS), symlinks=True)
    (copy / "DEBIAN").chmod(0o755)
    out = copy.parent / f"{tree.name}.deb"
    run_cmd(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(copy), str(out)],
        timeout=DPKG_TIMEOUT,
    )
    return out


def _add_to_pool(deb: Path, pool: Path) -> None:
    fields = run_cmd(
        ["dpkg-deb", "--show", "--showformat=${Package}\t${Version}\t${Architecture}", str(deb)],
        timeout=DPKG_TIMEOUT,
    ).stdout.decode()
    name, version, arch = fields.strip().split("\t")
    target = pool / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
    if target.exists():
        raise InputError(f"two package sources build {name} {version} ({arch})")
    shutil.copy2(deb, target)


def host_arch() -> str:
    """The Debian architecture of this machine (``amd64``)."""
    return run_cmd(["dpkg", "--print-architecture"], timeout=30).stdout.decode().strip()


def _index(repo: Path) -> None:
    arch = host_arch()
    dist = repo / "dists" / SUITE
    bin_dir = dist / COMPONENT / f"binary-{arch}"
    bin_dir.mkdir(parents=True)
    packages = run_cmd(
        ["apt-ftparchive", "packages", f"pool/{COMPONENT}"], timeout=DPKG_TIMEOUT, cwd=repo
    ).stdout
    (bin_dir / "Packages").write_bytes(packages)
    (bin_dir / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    opts = {
        "Origin": "gpuforge-lab",
        "Label": "gpuforge lab mirror",
        "Suite": SUITE,
        "Codename": SUITE,
        "Components": COMPONENT,
        "Architectures": arch,
        "Description": "gpuforge lab packages (built locally, signed with the lab key)",
    }
    args = ["apt-ftparchive"]
    for key, value in opts.items():
        args += ["-o", f"APT::FTPArchive::Release::{key}={value}"]
    release = run_cmd([*args, "release", "."], timeout=DPKG_TIMEOUT, cwd=dist).stdout
    (dist / "Release").write_bytes(release)


def _sign(repo: Path, gpg_dir: Path, fingerprint: str) -> None:
    dist = repo / "dists" / SUITE
    release = str(dist / "Release")
    _gpg(
        gpg_dir,
        ["--local-user", fingerprint, "--clearsign", "-o", str(dist / "InRelease"), release],
    )
    _gpg(
        gpg_dir,
        ["--local-user", fingerprint, "--armor", "--detach-sign", "-o", f"{release}.gpg", release],
    )


def _export_key(repo: Path, gpg_dir: Path, fingerprint: str) -> None:
    _gpg(gpg_dir, ["--armor", "--output", str(repo / KEY_ASC), "--export", fingerprint])
    _gpg(gpg_dir, ["--output", str(repo / KEY_GPG), "--export", fingerprint])


def _publish(staging: Path, live: Path) -> None:
    """Swap the new repository into ``live`` without replacing ``live`` itself.

    A running mirror container bind-mounts ``live``; replacing its children (not the directory)
    keeps that mount valid.  New pool files land before the indexes that name them.
    """
    live.mkdir(parents=True, exist_ok=True)
    live_pool = live / "pool" / COMPONENT
    live_pool.mkdir(parents=True, exist_ok=True)
    new_debs = {p.name for p in (staging / "pool" / COMPONENT).iterdir()}
    for name in new_debs:
        (staging / "pool" / COMPONENT / name).replace(live_pool / name)
    for name in (KEY_ASC, KEY_GPG):
        (staging / name).replace(live / name)
    old = live / "dists.old"
    shutil.rmtree(old, ignore_errors=True)
    if (live / "dists").exists():
        (live / "dists").replace(old)
    (staging / "dists").replace(live / "dists")
    shutil.rmtree(old, ignore_errors=True)
    for stale in live_pool.iterdir():
        if stale.name not in new_debs:
            stale.unlink()
    for entry in (live, live / "pool", live_pool, live / "dists"):
        entry.chmod(0o755)
    (staging / HASH_FILE).replace(live / HASH_FILE)


def _pool_names(repo: Path) -> tuple[str, ...]:
    pool = repo / "pool" / COMPONENT
    return tuple(sorted(p.name for p in pool.glob("*.deb"))) if pool.is_dir() else ()


def _source_files(base: Path) -> Iterable[Path]:
    if not base.is_dir():
        return []
    return sorted(
        p for p in base.rglob("*") if p.is_file() and not _IGNORED_PARTS.intersection(p.parts)
    )


def _quiet(_message: str) -> None:
    pass
