#!/usr/bin/env python3
"""Write the lab mirror's simulator packages as package trees (``DIR/<name>_<version>/DEBIAN``).

Usage: ``build_packages.py --out DIR``. The lab mirror (src/gpuforge/lab/mirror.py) builds each
tree with ``dpkg-deb`` and indexes it. Stdlib only; takes well under a second.

Names and versions are NVIDIA's (CUDA repository for Debian 12) and Debian's, so roles install
them exactly as they would in production. Every package's Description starts with
"gpuforge lab simulator" and none of them belongs outside the lab.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpuforge_sim import __version__ as SIM_VERSION  # noqa: E402, N812
from gpuforge_sim.dcgm_exporter import COUNTERS_CSV  # noqa: E402
from gpuforge_sim.skus import CATALOGUE_NAME, CATALOGUE_PATHS  # noqa: E402

LIB = "/usr/lib/gpuforge-sim"
MAINTAINER = "gpuforge lab <lab@gpuforge.invalid>"
DRIVER_VERSIONS = ("570.133.20", "570.124.06")
NCCL_VERSIONS = ("2.26.2", "2.25.1")
NCCL_CUDA = "12.8"
# Two of each upgradable component, so an upgrade and its rollback run in the lab (issue 19):
# the first is the lab spec's pin, the second the older release a rollback returns to.
CUDA_TOOLKITS = (
    ("12-8", "12.8.1", "12.8.93"),  # package suffix, version, nvcc release
    ("12-8", "12.8.0", "12.8.61"),
)
DCGM_VERSIONS = ("1:4.2.3-1", "1:4.1.1-1")
# NVIDIA's CUDA repository names the exporter's package datacenter-gpu-manager-exporter and
# versions it <exporter release>-<DCGM version>-1 (the image tags read 4.2.3-4.1.3).
DCGM_EXPORTER_VERSION = "4.1.3-4.2.3-1"
NCCL_TESTS_VERSION = "2.13.13-1"
GPU_BURN_VERSION = "0.0~git20240221-1"
# Same names as Debian 12's packages with a higher version, so apt prefers the simulated tools
# on lab nodes without pinning (Debian: rdma-core 44.0-2, perftest 4.5+0.17-1).
RDMA_VERSION = "44.0-2+gpuforgesim1"
PERFTEST_VERSION = "4.5+0.17-1+gpuforgesim1"

ENTRY = """#!/usr/bin/python3 -SE
# {tool}: gpuforge lab simulator, not NVIDIA software. Reads /var/lib/gpuforge-sim/state.json.
import sys

sys.path.insert(0, "{lib}")
from gpuforge_sim.cli import run  # noqa: E402

sys.exit(run("{tool}", sys.argv[1:]))
"""

DIVERT_POSTINST = """#!/bin/sh
# gpuforge lab simulator: containers cannot fake /dev/kmsg or /proc/modules, so the simulated
# kernel module package diverts dmesg, lsmod and modprobe to wrappers (see docs/simulator.md).
set -e
PKG=nvidia-kernel-open-dkms
divert() {
    name=$1
    shift
    for path in "$@"; do
        if dpkg-query -S "$path" >/dev/null 2>&1; then
            dpkg-divert --package "$PKG" --add --rename --divert "$path.distrib" "$path" >/dev/null
            install -m 0755 "/usr/lib/gpuforge-sim/wrappers/$name" "$path"
        fi
    done
}
if [ "$1" = configure ]; then
    divert dmesg /bin/dmesg /usr/bin/dmesg
    divert lsmod /sbin/lsmod /bin/lsmod /usr/sbin/lsmod /usr/bin/lsmod
    divert modprobe /sbin/modprobe /usr/sbin/modprobe
    install -d -m 0755 /run/gpuforge-sim/modules
fi
exit 0
"""

DIVERT_POSTRM = """#!/bin/sh
set -e
PKG=nvidia-kernel-open-dkms
if [ "$1" = remove ] || [ "$1" = purge ]; then
    for path in /bin/dmesg /usr/bin/dmesg /sbin/lsmod /bin/lsmod /usr/sbin/lsmod /usr/bin/lsmod \\
                /sbin/modprobe /usr/sbin/modprobe; do
        if [ "$(dpkg-divert --listpackage "$path")" = "$PKG" ]; then
            rm -f "$path"
            dpkg-divert --package "$PKG" --remove --rename \\
                --divert "$path.distrib" "$path" >/dev/null
        fi
    done
fi
exit 0
"""

CUDA_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
    update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-{dotted} {prio}
fi
exit 0
"""

CUDA_PRERM = """#!/bin/sh
set -e
if [ "$1" = remove ]; then
    update-alternatives --remove cuda /usr/local/cuda-{dotted}
fi
exit 0
"""

FM_UNIT = """[Unit]
Description=NVIDIA fabric manager service (gpuforge lab simulator)
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
Restart=no

[Install]
WantedBy=multi-user.target
"""

NETDEVS_UNIT = """[Unit]
Description=Rail network interfaces standing in for IPoIB/RoCE netdevs (gpuforge lab simulator)
DefaultDependencies=no
After=local-fs.target
Before=systemd-networkd.service network-pre.target
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/gpuforge-sim-netdevs

[Install]
WantedBy=multi-user.target
"""

SYSFS_UNIT = """[Unit]
Description=IB ports' sysfs-shaped tree under /var/lib/gpuforge-sim/sys (gpuforge lab simulator)
After=local-fs.target

[Service]
Type=simple
ExecStart=/usr/sbin/gpuforge-sim-sysfs --every 5
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""

COMMON_POSTINST = """#!/bin/sh
# gpuforge lab simulator: create the rail interfaces now and at every boot, and keep the IB
# ports' sysfs-shaped tree fresh.
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl enable --now gpuforge-sim-netdevs.service >/dev/null 2>&1 || true
    systemctl enable gpuforge-sim-sysfs.service >/dev/null 2>&1 || true
    systemctl restart gpuforge-sim-sysfs.service >/dev/null 2>&1 || true
fi
exit 0
"""

DCGM_EXPORTER_UNIT = """[Unit]
Description=NVIDIA DCGM exporter (gpuforge lab simulator)
After=network-online.target

[Service]
ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv -a :9400
Restart=always

[Install]
WantedBy=multi-user.target
"""

DEVICES_UNIT = """[Unit]
Description=NVIDIA device files /dev/nvidia* (gpuforge lab simulator)
DefaultDependencies=no
After=local-fs.target
Before=nvidia-persistenced.service slurmd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/nvidia-modprobe

[Install]
WantedBy=multi-user.target
"""

DEVICES_POSTINST = """#!/bin/sh
# gpuforge lab simulator: create the device files now and at every boot (/dev is a tmpfs).
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl enable --now gpuforge-sim-nvidia-devices.service >/dev/null 2>&1 || true
fi
exit 0
"""

PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (gpuforge lab simulator)
Wants=syslog.target

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose
Restart=no

[Install]
WantedBy=multi-user.target
"""

PERSISTENCED = """#!/bin/sh
# gpuforge lab simulator: stands in for nvidia-persistenced, which keeps GPU state initialised
# while no client holds the device open. A lab node has no device to hold, so this only stays
# in the foreground for systemd to supervise, as the real daemon stays resident.
echo "nvidia-persistenced (gpuforge lab simulator): started with $*"
exec sleep infinity
"""

DCGM_UNIT = """[Unit]
Description=NVIDIA DCGM service (gpuforge lab simulator)

[Service]
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

NVCC = """#!/bin/sh
# nvcc: gpuforge lab simulator, not NVIDIA software (prints the version only).
cat <<EOF
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release {dotted}, V{release}
Build cuda_{dotted}.r{dotted}/compiler.35583870_0
(gpuforge lab simulator, not NVIDIA software)
EOF
"""


@dataclass
class Package:
    name: str
    version: str
    summary: str
    depends: list[str] = field(default_factory=list)
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (text, mode)
    scripts: dict[str, str] = field(default_factory=dict)  # postinst/postrm/... -> text
    extra: dict[str, str] = field(default_factory=dict)  # more control fields

    def control(self) -> str:
        fields = {
            "Package": self.name,
            "Version": self.version,
            "Architecture": "all",
            "Maintainer": MAINTAINER,
            "Section": "non-free/utils",
            "Priority": "optional",
        }
        if self.depends:
            fields["Depends"] = ", ".join(self.depends)
        fields.update(self.extra)
        fields["Description"] = (
            f"gpuforge lab simulator: {self.summary}\n"
            " Simulated stand-in for the package of the same name, for gpuforge's container lab"
            " only.\n"
            " It prints what the real tools print for the node described in\n"
            " /var/lib/gpuforge-sim/state.json. Not NVIDIA software; never install it on a real"
            " host."
        )
        return "".join(f"{k}: {v}\n" for k, v in fields.items())

    def write(self, out: Path) -> Path:
        root = out / f"{self.name}_{self.version.replace(':', '%3a')}"
        if root.exists():
            shutil.rmtree(root)
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN" / "control").write_text(self.control())
        for script, text in self.scripts.items():
            p = root / "DEBIAN" / script
            p.write_text(text)
            p.chmod(0o755)
        for path, (text, mode) in self.files.items():
            p = root / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            p.chmod(mode)
        doc = root / "usr/share/doc" / self.name / "README.gpuforge-sim"
        if not doc.exists():
            doc.parent.mkdir(parents=True, exist_ok=True)
            doc.write_text(f"{self.name} {self.version}: gpuforge lab simulator package.\n")
        return root


def catalogue_path() -> Path:
    """gpuforge's SKU catalogue (a checkout's or an installed wheel's), never a node's copy."""
    for path in CATALOGUE_PATHS[1:]:
        if path.is_file():
            return path
    raise SystemExit(f"build_packages: no SKU catalogue at {CATALOGUE_PATHS[1:]}")


def entry(tool: str) -> tuple[str, int]:
    return (ENTRY.format(tool=tool, lib=LIB), 0o755)


def common_package() -> Package:
    files: dict[str, tuple[str, int]] = {}
    for src in sorted((HERE / "gpuforge_sim").glob("*.py")):
        files[f"{LIB}/gpuforge_sim/{src.name}"] = (src.read_text(), 0o644)
    # gpuforge's SKU catalogue, which the simulator reads beside its modules (skus.py).
    files[f"{LIB}/gpuforge_sim/{CATALOGUE_NAME}"] = (catalogue_path().read_text(), 0o644)
    for tool in ("dmesg", "lsmod", "modprobe"):
        files[f"{LIB}/wrappers/{tool}"] = entry(tool)
    files["/usr/sbin/gpuforge-sim-netdevs"] = entry("gpuforge-sim-netdevs")
    files["/lib/systemd/system/gpuforge-sim-netdevs.service"] = (NETDEVS_UNIT, 0o644)
    files["/usr/sbin/gpuforge-sim-sysfs"] = entry("gpuforge-sim-sysfs")
    files["/lib/systemd/system/gpuforge-sim-sysfs.service"] = (SYSFS_UNIT, 0o644)
    files["/var/lib/gpuforge-sim/README"] = (
        "The lab writes state.json here: this node's hardware, the lab's faults and fabric.\n",
        0o644,
    )
    return Package(
        "gpuforge-sim-common",
        f"{SIM_VERSION}-1",
        "shared simulator code (Python, stdlib only)",
        ["python3 (>= 3.9)", "iproute2"],
        files,
        scripts={"postinst": COMMON_POSTINST},
    )


def driver_packages(version: str) -> list[Package]:
    v = f"{version}-1"
    branch = version.split(".", 1)[0]
    kernel = Package(
        "nvidia-kernel-open-dkms",
        v,
        f"NVIDIA open GPU kernel modules {version} (simulated: lsmod, modprobe, dmesg wrappers)",
        [f"gpuforge-sim-common (>= {SIM_VERSION}-1)", "kmod", "util-linux"],
        scripts={"postinst": DIVERT_POSTINST, "postrm": DIVERT_POSTRM},
        extra={"Provides": f"nvidia-kernel-dkms-any (= {v}), nvidia-open-kernel-dkms (= {v})"},
    )
    modprobe = Package(
        "nvidia-modprobe",
        v,
        f"utility to load the NVIDIA kernel module and create device files {version}",
        [f"gpuforge-sim-common (>= {SIM_VERSION}-1)"],
        {
            "/usr/bin/nvidia-modprobe": entry("nvidia-modprobe"),
            "/lib/systemd/system/gpuforge-sim-nvidia-devices.service": (DEVICES_UNIT, 0o644),
        },
        scripts={"postinst": DEVICES_POSTINST},
    )
    persistenced = Package(
        "nvidia-persistenced",
        v,
        f"daemon to maintain persistent software state in the NVIDIA driver {version}",
        [],
        {
            "/usr/bin/nvidia-persistenced": (PERSISTENCED, 0o755),
            "/lib/systemd/system/nvidia-persistenced.service": (PERSISTENCED_UNIT, 0o644),
        },
    )
    cuda = Package(
        "nvidia-driver-cuda",
        v,
        f"NVIDIA driver CUDA integration components {version} (simulated nvidia-smi)",
        [
            f"gpuforge-sim-common (>= {SIM_VERSION}-1)",
            f"nvidia-kernel-open-dkms (= {v})",
            f"nvidia-persistenced (= {v})",
            f"nvidia-modprobe (= {v})",
        ],
        {"/usr/bin/nvidia-smi": entry("nvidia-smi")},
    )
    driver = Package(
        "nvidia-driver",
        v,
        f"NVIDIA metapackage {version}",
        [f"nvidia-driver-cuda (= {v})", f"nvidia-kernel-open-dkms (= {v})"],
    )
    drivers_branch = Package(
        f"cuda-drivers-{branch}",
        v,
        f"CUDA drivers meta-package, branch {branch}",
        [f"nvidia-driver-cuda (= {v})", f"nvidia-kernel-open-dkms (= {v})"],
    )
    drivers = Package(
        "cuda-drivers",
        v,
        "CUDA drivers meta-package",
        [f"cuda-drivers-{branch} (= {v})"],
    )
    fm = Package(
        f"nvidia-fabricmanager-{branch}",
        v,
        f"NVIDIA fabric manager {version} (simulated daemon and systemd unit)",
        [f"gpuforge-sim-common (>= {SIM_VERSION}-1)"],
        {
            "/usr/bin/nv-fabricmanager": entry("nv-fabricmanager"),
            "/lib/systemd/system/nvidia-fabricmanager.service": (FM_UNIT, 0o644),
            "/usr/share/nvidia/nvswitch/fabricmanager.cfg": (
                "# gpuforge lab simulator: fabric manager settings are not read.\n"
                "FABRIC_MODE=0\nLOG_LEVEL=4\n",
                0o644,
            ),
            "/usr/share/nvidia/nvswitch/gpuforge-sim-fm-version": (version + "\n", 0o644),
        },
        extra={"Provides": "nvidia-fabricmanager", "Conflicts": "nvidia-fabricmanager"},
    )
    return [kernel, modprobe, persistenced, cuda, driver, drivers_branch, drivers, fm]


def nccl_packages(version: str) -> list[Package]:
    v = f"{version}-1+cuda{NCCL_CUDA}"
    lib = Package(
        "libnccl2",
        v,
        f"NVIDIA Collective Communication Library (NCCL) runtime {version} (version marker only)",
        [],
    )
    dev = Package(
        "libnccl-dev",
        v,
        f"NVIDIA Collective Communication Library (NCCL) development files {version}",
        [f"libnccl2 (= {v})"],
        {
            "/usr/include/nccl.h": (
                f"/* gpuforge lab simulator: NCCL {version} header placeholder */\n"
                f"#define NCCL_MAJOR {version.split('.', maxsplit=1)[0]}\n"
                f"#define NCCL_MINOR {version.split('.')[1]}\n"
                f"#define NCCL_PATCH {version.split('.')[2]}\n",
                0o644,
            )
        },
    )
    return [lib, dev]


def dcgm_packages(version: str) -> list[Package]:
    return [
        Package(
            "datacenter-gpu-manager-4-core",
            version,
            "NVIDIA Data Center GPU Manager 4 (simulated dcgmi and nv-hostengine)",
            [f"gpuforge-sim-common (>= {SIM_VERSION}-1)"],
            {
                "/usr/bin/dcgmi": entry("dcgmi"),
                "/usr/bin/nv-hostengine": entry("nv-hostengine"),
                "/lib/systemd/system/nvidia-dcgm.service": (DCGM_UNIT, 0o644),
            },
        ),
        Package(
            "datacenter-gpu-manager-4-cuda12",
            version,
            "NVIDIA Data Center GPU Manager 4, CUDA 12 diagnostics",
            [f"datacenter-gpu-manager-4-core (= {version})"],
        ),
    ]


def cuda_packages(toolkit: tuple[str, str, str]) -> list[Package]:
    suffix, version, release = toolkit
    dotted = suffix.replace("-", ".")
    return [
        Package(
            f"cuda-toolkit-{suffix}",
            f"{version}-1",
            f"CUDA Toolkit {dotted} (version files and a simulated nvcc --version only)",
            [],
            {
                f"/usr/local/cuda-{dotted}/version.json": (
                    '{\n   "cuda" : {\n      "name" : "CUDA SDK",\n'
                    f'      "version" : "{version}"\n   }},\n'
                    '   "cuda_nvcc" : {\n      "name" : "CUDA NVCC",\n'
                    f'      "version" : "{release}"\n   }}\n}}\n',
                    0o644,
                ),
                f"/usr/local/cuda-{dotted}/bin/nvcc": (
                    NVCC.format(dotted=dotted, release=release),
                    0o755,
                ),
            },
            scripts={
                "postinst": CUDA_POSTINST.format(dotted=dotted, prio=suffix.replace("-", "")),
                "prerm": CUDA_PRERM.format(dotted=dotted),
            },
        ),
    ]


def tool_packages() -> list[Package]:
    return [
        Package(
            "nccl-tests",
            NCCL_TESTS_VERSION,
            "NVIDIA/nccl-tests performance tests (simulated *_perf binaries)",
            [f"gpuforge-sim-common (>= {SIM_VERSION}-1)", "libnccl2 (>= 2.18)"],
            {
                f"/usr/bin/{coll}_perf": entry(f"{coll}_perf")
                for coll in ("all_reduce", "all_gather", "alltoall", "sendrecv")
            },
        ),
        Package(
            "gpu-burn",
            GPU_BURN_VERSION,
            "wilicc/gpu-burn multi-GPU stress test (simulated)",
            [f"gpuforge-sim-common (>= {SIM_VERSION}-1)"],
            {"/usr/bin/gpu_burn": entry("gpu_burn")},
        ),
        Package(
            "datacenter-gpu-manager-exporter",
            DCGM_EXPORTER_VERSION,
            "NVIDIA DCGM exporter for Prometheus (simulated dcgm-exporter on :9400)",
            [f"gpuforge-sim-common (>= {SIM_VERSION}-1)", "datacenter-gpu-manager-4-core"],
            {
                "/usr/bin/dcgm-exporter": entry("dcgm-exporter"),
                "/etc/dcgm-exporter/default-counters.csv": (COUNTERS_CSV, 0o644),
                "/lib/systemd/system/nvidia-dcgm-exporter.service": (DCGM_EXPORTER_UNIT, 0o644),
            },
        ),
        Package(
            "infiniband-diags",
            RDMA_VERSION,
            "InfiniBand diagnostic programs (simulated ibstat and perfquery)",
            [f"gpuforge-sim-common (>= {SIM_VERSION}-1)"],
            {"/usr/sbin/ibstat": entry("ibstat"), "/usr/sbin/perfquery": entry("perfquery")},
        ),
        Package(
            "ibverbs-utils",
            RDMA_VERSION,
            "Examples for the libibverbs library (simulated ibv_devinfo)",
            [f"gpuforge-sim-common (>= {SIM_VERSION}-1)"],
            {"/usr/bin/ibv_devinfo": entry("ibv_devinfo")},
        ),
        Package(
            "perftest",
            PERFTEST_VERSION,
            "InfiniBand verbs performance tests (simulated ib_write_bw)",
            [f"gpuforge-sim-common (>= {SIM_VERSION}-1)"],
            {"/usr/bin/ib_write_bw": entry("ib_write_bw")},
        ),
    ]


def all_packages() -> list[Package]:
    pkgs = [common_package()]
    for v in DRIVER_VERSIONS:
        pkgs += driver_packages(v)
    for v in NCCL_VERSIONS:
        pkgs += nccl_packages(v)
    for toolkit in CUDA_TOOLKITS:
        pkgs += cuda_packages(toolkit)
    for v in DCGM_VERSIONS:
        pkgs += dcgm_packages(v)
    pkgs += tool_packages()
    return pkgs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for the package trees")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for pkg in all_packages():
        root = pkg.write(args.out)
        print(f"{pkg.name} {pkg.version} -> {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
