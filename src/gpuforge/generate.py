"""The generate step: a cluster's ``generated/`` directory, composed from every layer's files.

``gpuforge inventory generate`` lands here. The layers below each render their own files, as
text, from the expanded cluster and know nothing of each other or of the directory:

* :mod:`gpuforge.inventory.render`: ``hosts.yml``, ``group_vars/``, ``hosts``, ``topology.json``;
* :mod:`gpuforge.slurm.conf`: ``slurm/nodes.conf``, ``slurm/topology.conf``;
* :mod:`gpuforge.monitoring.render`: ``monitoring/`` (file_sd targets, one ``prometheus.yml``
  per Prometheus server, the spec's recording rules), and the ``monitoring`` group with its
  ``group_vars/monitoring.yml``, which the inventory writes like its own.

This module puts them together with ``.gpuforge-generated``, the marker that lets gpuforge
replace the directory (a directory without it is someone else's and is never replaced), writes
``generated/`` atomically and creates ``site/`` once from the sample (docs/topology.md; the
layout is docs/contracts.md's).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuforge.errors import InputError, OperationError
from gpuforge.inventory.reader import GENERATED, MARKER, SITE, InventoryDir
from gpuforge.inventory.reader import sample_site as default_sample_site
from gpuforge.inventory.render import inventory_files
from gpuforge.monitoring.render import (
    MONITORING_GROUP,
    monitoring_files,
    monitoring_group,
    monitoring_vars,
)
from gpuforge.slurm.conf import slurm_files
from gpuforge.topology.cluster import Cluster, collector_paused


def marker_text(cluster: Cluster) -> str:
    """The content of :data:`~gpuforge.inventory.reader.MARKER` (deterministic)."""
    return (
        f"Written by gpuforge inventory generate for cluster {cluster.name}. gpuforge replaces\n"
        "this directory as a whole on the next run; put what the site owns in ../site/.\n"
    )


def render_files(cluster: Cluster) -> dict[str, str]:
    """Every file of ``generated/``: relative path -> text. Deterministic for a given cluster."""
    files = {MARKER: marker_text(cluster)}
    with collector_paused():
        files.update(
            inventory_files(
                cluster,
                extra_groups=monitoring_group(cluster),
                extra_group_vars={MONITORING_GROUP: monitoring_vars(cluster)},
            )
        )
        files.update(slurm_files(cluster))
        files.update(monitoring_files(cluster))
    return files


def check_replaceable(out: Path, protect: Sequence[Path] = ()) -> None:
    """Refuse (InputError, exit 2) unless ``out`` is absent, empty or written by gpuforge.

    Nothing under a directory in ``protect`` (the input spec) is ever replaced either.
    """
    for path in protect:
        if _inside(Path(path), out):
            raise InputError(f"refusing to replace {out}: it holds the input {path}")
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise InputError(f"refusing to replace {out}: it is not a directory gpuforge wrote")
    if (out / MARKER).is_file() or not any(out.iterdir()):
        return
    raise InputError(
        f"refusing to replace {out}: gpuforge did not write it (no {MARKER}); "
        "move it away or pick another directory"
    )


def _inside(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())


def write_inventory(
    cluster: Cluster, out_dir: Path | str, *, protect: Sequence[Path] = ()
) -> list[Path]:
    """Write the generated layer into ``out_dir`` atomically; return the files written.

    Everything is rendered first, written into a temporary directory next to ``out_dir``, and
    renamed into place; an existing ``out_dir`` is replaced as a whole, but only when gpuforge
    wrote it (:func:`check_replaceable`) and it holds nothing in ``protect``.
    """
    out = Path(out_dir)
    check_replaceable(out, protect)
    files = render_files(cluster)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise OperationError(f"cannot write inventory next to {out}: {exc}") from exc
    old: Path | None = None
    try:
        tmp.chmod(0o755)
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.replace(old / out.name)
        tmp.replace(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            (old / out.name).replace(out)
        raise OperationError(f"cannot write inventory {out}: {exc}") from exc
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return [out / rel for rel in files]


@dataclass(frozen=True)
class Generated:
    """What :func:`write_cluster_inventory` did."""

    root: Path
    files: tuple[Path, ...]
    site_created: bool


def write_cluster_inventory(
    cluster: Cluster,
    root: Path | str,
    *,
    protect: Sequence[Path] = (),
    sample_site: Path | None = None,
) -> Generated:
    """Write ``root/generated/`` (atomically) and create ``root/site/`` once from the sample.

    ``root`` must be absent, empty, hold only a ``site/``, or be a cluster directory gpuforge
    wrote before (``generated/`` with its marker): anything else is refused with InputError
    and left as it was. An existing ``site/`` is never touched.
    """
    inv = InventoryDir(Path(root))
    if inv.root.exists() or inv.root.is_symlink():
        if not inv.root.is_dir():
            raise InputError(f"refusing to write an inventory into {inv.root}: not a directory")
        foreign = sorted(
            p.name
            for p in inv.root.iterdir()
            if not p.name.startswith(".") and p.name not in (GENERATED, SITE)
        )
        if foreign and not (inv.generated / MARKER).is_file():
            raise InputError(
                f"refusing to write an inventory into {inv.root}: it is not a gpuforge cluster "
                f"directory (no {GENERATED}/{MARKER}) and holds {', '.join(foreign[:5])}; "
                "pick a new directory"
            )
    if inv.site.exists() and not inv.site.is_dir():
        raise InputError(f"{inv.site} exists and is not a directory")
    files = write_inventory(cluster, inv.generated, protect=protect)
    created = False
    if not inv.site.exists():
        _copy_site(sample_site or default_sample_site(), inv.site)
        created = True
    return Generated(inv.root, tuple(files), created)


def _copy_site(sample: Path, site: Path) -> None:
    """Copy the sample site layer into place atomically (a copy, then one rename)."""
    if not sample.is_dir():
        raise OperationError(f"no sample site layer at {sample}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{site.name}.tmp-", dir=site.parent))
    try:
        shutil.copytree(sample, tmp / SITE)
        (tmp / SITE).replace(site)
    except OSError as exc:
        raise OperationError(f"cannot create {site} from {sample}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
