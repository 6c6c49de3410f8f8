"""The lab node image: Debian bookworm with systemd as PID 1, sshd and Python.

Built without any registry: ``debootstrap`` into a scratch directory, the recipe's ``rootfs/``
overlay copied on top, ``setup.sh`` run in a chroot, then ``podman import``.  The image is tagged
``localhost/gpuforge-node:<recipe hash>`` and ``:latest``; it is rebuilt only when a file of the
recipe (``lab/image/``) or the builder's own parameters change.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuforge.errors import InputError, OperationError
from gpuforge.lab import podman
from gpuforge.lab.paths import BUILD_DIR, CACHE_DIR, IMAGE_RECIPE_DIR
from gpuforge.lab.proc import file_lock, run_cmd

IMAGE_REPO = "localhost/gpuforge-node"
LATEST = f"{IMAGE_REPO}:latest"
SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: Bumped when the build steps below change in a way the recipe files do not show.
BUILDER_VERSION = "1"

#: Generous: on a loaded two-core machine the second stage alone has taken over 20 minutes.
DEBOOTSTRAP_TIMEOUT = 3600.0
SETUP_TIMEOUT = 600.0
IMPORT_TIMEOUT = 600.0

_CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_CHANGES = (
    'CMD ["/sbin/init"]',
    "STOPSIGNAL SIGRTMIN+3",
    "ENV container=podman",
    "ENV LANG=C.UTF-8",
)


@dataclass(frozen=True)
class ImageResult:
    """Outcome of :func:`ensure_image`."""

    ref: str
    recipe_hash: str
    built: bool
    seconds: float


def recipe_files(recipe_dir: Path = IMAGE_RECIPE_DIR) -> list[Path]:
    """Every file of the recipe, sorted, relative to ``recipe_dir``."""
    return sorted(p.relative_to(recipe_dir) for p in recipe_dir.rglob("*") if p.is_file())


def recipe_hash(recipe_dir: Path = IMAGE_RECIPE_DIR) -> str:
    """A short digest over the recipe's paths, modes and contents and the builder parameters."""
    digest = hashlib.sha256()
    digest.update(f"{BUILDER_VERSION}\0{SUITE}\0{DEBIAN_MIRROR}\0{_CHANGES}\0".encode())
    for rel in recipe_files(recipe_dir):
        path = recipe_dir / rel
        digest.update(f"{rel.as_posix()}\0{path.stat().st_mode & 0o777:o}\0".encode())
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def packages(recipe_dir: Path = IMAGE_RECIPE_DIR) -> list[str]:
    """The package names of ``packages.txt`` (comments and blank lines dropped)."""
    names = []
    for line in (recipe_dir / "packages.txt").read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


def ensure_image(
    *,
    force: bool = False,
    recipe_dir: Path = IMAGE_RECIPE_DIR,
    progress: Callable[[str], None] | None = None,
) -> ImageResult:
    """Build the node image unless the one for the current recipe exists; tag it ``:latest``.

    Serialised by a lock file, so parallel callers (Molecule scenarios, ``lab up``) build once.
    """
    if not (recipe_dir / "packages.txt").is_file():
        raise InputError(f"{recipe_dir}: not an image recipe (no packages.txt)")
    started = time.monotonic()
    digest = recipe_hash(recipe_dir)
    ref = f"{IMAGE_REPO}:{digest}"
    with file_lock(BUILD_DIR / "locks" / "lab-image.lock"):
        built = False
        if force or not podman.image_exists(ref):
            _build(ref, digest, recipe_dir, progress or _quiet)
            built = True
        if not podman.image_exists(LATEST) or podman.image_id(LATEST) != podman.image_id(ref):
            podman.tag(ref, LATEST)
    return ImageResult(ref=ref, recipe_hash=digest, built=built, seconds=time.monotonic() - started)


def _build(ref: str, digest: str, recipe_dir: Path, say: Callable[[str], None]) -> None:
    scratch_parent = BUILD_DIR / "tmp"
    scratch_parent.mkdir(parents=True, exist_ok=True)
    # We hold the build lock: any scratch directory left here is from a builder that was killed.
    for stale in scratch_parent.glob("image-*"):
        _remove_tree(stale)
    scratch = Path(tempfile.mkdtemp(prefix="image-", dir=scratch_parent))
    root = scratch / "root"
    try:
        _bootstrap(root, recipe_dir, say)
        overlay = recipe_dir / "rootfs"
        if overlay.is_dir():
            shutil.copytree(overlay, root, dirs_exist_ok=True, symlinks=True)
        setup = root / "tmp" / "gpuforge-setup.sh"
        shutil.copy2(recipe_dir / "setup.sh", setup)
        say("running setup.sh in the image root")
        run_cmd(
            ["chroot", str(root), "/bin/sh", "/tmp/gpuforge-setup.sh"],  # noqa: S108 - in the chroot
            timeout=SETUP_TIMEOUT,
            env=_CHROOT_ENV,
        )
        setup.unlink(missing_ok=True)
        tarball = scratch / "rootfs.tar"
        _tar(root, tarball)
        say(f"importing {ref}")
        podman.import_tarball(
            tarball,
            ref,
            [*_CHANGES, f"LABEL gpuforge.lab.recipe={digest}"],
            timeout=IMPORT_TIMEOUT,
        )
    finally:
        _remove_tree(scratch)


def base_key(recipe_dir: Path = IMAGE_RECIPE_DIR) -> str:
    """Digest of what debootstrap produces: suite, mirror and package list."""
    text = f"{BUILDER_VERSION}\0{SUITE}\0{DEBIAN_MIRROR}\0{','.join(packages(recipe_dir))}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _bootstrap(root: Path, recipe_dir: Path, say: Callable[[str], None]) -> None:
    """Debootstrap into ``root``, or unpack the cached result of the same package list.

    Two stages with dpkg's ``force-unsafe-io`` in between: the root is a throwaway build tree,
    and skipping dpkg's fsync calls makes the second stage several times faster.
    """
    cached = CACHE_DIR / f"rootfs-{base_key(recipe_dir)}.tar"
    if cached.is_file():
        say(f"unpacking cached base {cached.name}")
        root.mkdir()
        run_cmd(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-xf", str(cached)],
            timeout=IMPORT_TIMEOUT,
        )
        return
    debs = CACHE_DIR / "debootstrap"
    debs.mkdir(parents=True, exist_ok=True)
    say(f"debootstrap {SUITE} ({len(packages(recipe_dir))} extra packages)")
    run_cmd(
        [
            "debootstrap",
            "--foreign",
            "--variant=minbase",
            f"--include={','.join(packages(recipe_dir))}",
            f"--cache-dir={debs}",
            "--components=main",
            SUITE,
            str(root),
            DEBIAN_MIRROR,
        ],
        timeout=DEBOOTSTRAP_TIMEOUT,
    )
    unsafe_io = root / "etc" / "dpkg" / "dpkg.cfg.d" / "gpuforge-build-unsafe-io"
    unsafe_io.parent.mkdir(parents=True, exist_ok=True)
    unsafe_io.write_text("force-unsafe-io\n")
    say("debootstrap second stage")
    try:
        run_cmd(
            ["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"],
            timeout=DEBOOTSTRAP_TIMEOUT,
            env=_CHROOT_ENV,
        )
    finally:
        _unmount_below(root)
    unsafe_io.unlink()
    partial = cached.with_suffix(".tar.partial")
    _tar(root, partial)
    partial.replace(cached)


def _tar(root: Path, tarball: Path) -> None:
    run_cmd(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(tarball), "."],
        timeout=IMPORT_TIMEOUT,
    )


def _mounts_below(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    points = [line.split()[1] for line in mounts if len(line.split()) > 1]
    return sorted((p for p in points if p.startswith(prefix)), reverse=True)


def _unmount_below(path: Path) -> None:
    for point in _mounts_below(path):
        run_cmd(["umount", "--lazy", point], timeout=60, check=False)


def _remove_tree(path: Path) -> None:
    """Remove a build tree, never following a mount left inside it into the host."""
    if not path.exists():
        return
    _unmount_below(path)
    if _mounts_below(path):
        raise OperationError(f"{path} still has mounts inside; not removing it")
    shutil.rmtree(path, ignore_errors=True)


def _quiet(_message: str) -> None:
    pass
