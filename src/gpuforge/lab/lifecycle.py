"""A lab cluster: one systemd container per node of a topology spec, reached over real SSH.

This module orchestrates podman (network, containers, the mirror, boot, keys); the files it
writes are rendered by :mod:`gpuforge.lab.files` from the plan of :mod:`gpuforge.lab.plan`.

``up`` is idempotent: containers, the network, the SSH key, known_hosts, the SSH/Ansible
configuration and the inventory are created only when missing or different, and a second run
reports that nothing changed.  The management network of the spec *is* the lab network: every
container gets its node's management address, so the generated inventory and ``/etc/hosts`` are
the same as on real hardware.  Lab state lives under ``.lab/<lab>/``, its cluster directory (the
generated and site layers, as for any cluster) under ``.lab/<lab>/inventory/``; ``down``
removes every podman object labelled ``gpuforge.lab=<lab>`` and that directory.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.atomic import write_atomic
from gpuforge.errors import InputError, OperationError
from gpuforge.inventory.reader import InventoryDir
from gpuforge.lab import faults as lab_faults
from gpuforge.lab import files, podman
from gpuforge.lab.image import LATEST
from gpuforge.lab.paths import MIRROR_DIR, STATE_ROOT
from gpuforge.lab.plan import LabNode, LabPlan
from gpuforge.lab.proc import file_lock, run_cmd

MIRROR_ROOT_IN_CONTAINER = "/srv/lab-mirror"
SIM_STATE_PATH = "/var/lib/gpuforge-sim/state.json"
BOOT_TIMEOUT = 180.0
SSH_TIMEOUT = 30.0
MAX_PARALLEL = 8
#: Writes the generated layer of a cluster directory (and its site layer from the sample, once).
InventoryWriter = Callable[[Path], None]
Progress = Callable[[str], None]


@dataclass
class UpResult:
    """What ``up`` did."""

    plan: LabPlan
    state_dir: Path
    created: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    files_changed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        """Whether anything was created, started or rewritten."""
        return bool(self.created or self.started or self.files_changed)


def state_dir(name: str) -> Path:
    """Where lab ``name`` keeps its key, known_hosts, configs and inventory."""
    return STATE_ROOT / name


def inventory_dir(name: str) -> InventoryDir:
    """The cluster directory of lab ``name`` (generated and site layers)."""
    return InventoryDir(state_dir(name) / "inventory")


def labels(name: str, **extra: str) -> dict[str, str]:
    """The labels of every podman object of lab ``name``."""
    return {podman.LAB_LABEL: name, **{f"{podman.LAB_LABEL}.{k}": v for k, v in extra.items()}}


def up(
    plan: LabPlan,
    write_inventory: InventoryWriter,
    *,
    image: str = LATEST,
    mirror_dir: Path = MIRROR_DIR,
    cluster_info: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> UpResult:
    """Bring lab ``plan`` up (or make sure it is up) and write its inventory and configs.

    ``write_inventory(root)`` writes the generated layer of the cluster directory ``root``
    (``gpuforge.generate.write_cluster_inventory``); the lab then fills in the site layer.
    """
    say = progress or _quiet
    started = time.monotonic()
    plan.validate()
    sdir = state_dir(plan.name)
    result = UpResult(plan=plan, state_dir=sdir)
    with file_lock(STATE_ROOT / f".{plan.name}.lock"):
        sdir.mkdir(parents=True, exist_ok=True)
        sdir.chmod(0o700)
        key = _ensure_ssh_key(plan.name, sdir, result)
        _ensure_network(plan, result)
        to_boot = _ensure_containers(plan, image, mirror_dir, result, say)
        say(f"waiting for {len(plan.nodes)} nodes to boot")
        pub = key.with_suffix(".pub").read_bytes()
        hosts_file = files.etc_hosts(plan).encode()
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(plan.nodes))) as pool:
            host_keys = dict(
                zip(
                    (n.hostname for n in plan.nodes),
                    pool.map(
                        lambda n: _prepare_node(plan, n, pub, hosts_file, n.hostname in to_boot),
                        plan.nodes,
                    ),
                    strict=True,
                )
            )
        for hostname, changed in host_keys.items():
            if changed[1]:
                result.files_changed.append(f"{hostname}:/etc/hosts,authorized_keys")
        keys = {host: value[0] for host, value in host_keys.items()}
        _write_if_changed(sdir / "known_hosts", files.known_hosts(plan, keys), result)
        _write_if_changed(sdir / "ssh_config", files.ssh_config(plan, sdir, key), result)
        inv = inventory_dir(plan.name)
        _write_if_changed(sdir / "ansible.cfg", files.ansible_cfg(sdir, inv), result)
        _write_if_changed(sdir / "lab.json", json.dumps(_state(plan), indent=2) + "\n", result)
        if cluster_info is not None:
            info = json.dumps(cluster_info, indent=2, sort_keys=True) + "\n"
            _write_if_changed(sdir / "cluster-info.json", info, result)
        _write_inventory(plan, inv, key, write_inventory, result)
        say("checking SSH to every node")
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(plan.nodes))) as pool:
            list(pool.map(lambda n: ssh_run(plan.name, n.hostname, ["true"]), plan.nodes))
    result.seconds = time.monotonic() - started
    return result


def down(name: str, *, timeout: float = 180.0) -> list[str]:
    """Remove every container and network of lab ``name`` and its state; returns what went."""
    selector = f"{podman.LAB_LABEL}={name}"
    gone = [c.name for c in podman.containers(selector)]
    podman.rm(gone, timeout=timeout)
    for net in podman.networks(selector):
        podman.network_rm(net)
        gone.append(net)
    sdir = state_dir(name)
    if sdir.exists():
        shutil.rmtree(sdir)
        gone.append(str(sdir))
    return gone


def load_plan(name: str) -> LabPlan:
    """The plan of a lab that is up, from its state file."""
    path = state_dir(name) / "lab.json"
    if not path.is_file():
        raise InputError(f"lab {name!r} is not up (no {path}); run gpuforge lab up")
    data = json.loads(path.read_text())
    return LabPlan(
        name=data["name"],
        domain=data["domain"],
        subnet=data["subnet"],
        gateway=data["gateway"],
        nodes=tuple(LabNode(**n) for n in data["nodes"]),
    )


def known_labs() -> list[str]:
    """Names of labs that have state here or containers in podman."""
    names = {p.name for p in STATE_ROOT.iterdir() if p.is_dir()} if STATE_ROOT.is_dir() else set()
    for info in podman.containers(podman.LAB_LABEL):
        value = info.labels.get(podman.LAB_LABEL)
        if value:
            names.add(value)
    return sorted(names)


@dataclass(frozen=True)
class LabNodeStatus:
    """One row of ``lab status``."""

    name: str
    hostname: str
    role: str
    address: str
    state: str
    uptime_s: int


def status(name: str) -> list[LabNodeStatus]:
    """The containers of lab ``name`` with their role, address, state and uptime."""
    now = int(time.time())
    rows = []
    for info in podman.containers(f"{podman.LAB_LABEL}={name}"):
        running = info.state == "running"
        rows.append(
            LabNodeStatus(
                name=info.name,
                hostname=info.labels.get(f"{podman.LAB_LABEL}.hostname", ""),
                role=info.labels.get(f"{podman.LAB_LABEL}.role", ""),
                address=info.labels.get(f"{podman.LAB_LABEL}.address", ""),
                state=info.state,
                uptime_s=max(0, now - info.started_at) if running and info.started_at else 0,
            )
        )
    return rows


def ssh_command(name: str, node: str, command: Sequence[str] = ()) -> list[str]:
    """The ``ssh`` command line that reaches ``node`` of lab ``name`` as root, host keys checked."""
    plan = load_plan(name)
    target = plan.node(node)
    cmd = ["ssh", "-F", str(state_dir(name) / "ssh_config"), target.hostname]
    if command:
        cmd += ["--", shlex.join(command)]
    return cmd


def ssh_run(
    name: str, node: str, command: Sequence[str], *, timeout: float = SSH_TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` on ``node`` over SSH (BatchMode: never prompts); raises on failure."""
    cmd = ssh_command(name, node, command)
    cmd[1:1] = ["-o", "BatchMode=yes"]
    return run_cmd(cmd, timeout=timeout)


def apply_faults(name: str, states: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Write each node's simulator state (``states[hostname]``) to that node of lab ``name``."""
    plan = load_plan(name)
    missing = sorted({n.hostname for n in plan.nodes} - set(states))
    if missing:
        raise InputError(f"no simulator state for {', '.join(missing)}")

    def put(node: LabNode) -> None:
        state = dict(states[node.hostname])
        # a fault already on the node keeps its injection time (no second Xid, no counter reset)
        old = podman.exec_(
            plan.container(node.hostname), ["cat", SIM_STATE_PATH], timeout=30, check=False
        )
        try:
            previous = json.loads(old.stdout) if old.returncode == 0 else None
        except ValueError:
            previous = None
        lab_faults.sim_faults().carry_over(state, previous)
        data = (json.dumps(state, indent=2, sort_keys=True) + "\n").encode()
        podman.put_file(plan.container(node.hostname), data, SIM_STATE_PATH)
        # wrong_driver / wrong_nccl: the node really gets that version, as on a real node
        script = lab_faults.sim_faults().pin_install_script(state.get("package_pins") or {})
        if script:
            done = podman.exec_(
                plan.container(node.hostname), ["sh", "-c", script], timeout=600, check=False
            )
            if done.returncode != 0:
                raise OperationError(
                    f"{node.hostname}: installing {state['package_pins']} failed: "
                    f"{done.stderr.decode(errors='replace')[-500:]}"
                )

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(plan.nodes))) as pool:
        list(pool.map(put, plan.nodes))
    return [n.hostname for n in plan.nodes]


def load_cluster_info(name: str) -> dict[str, Any]:
    """The simulator's view of lab ``name`` saved by ``up``."""
    path = state_dir(name) / "cluster-info.json"
    if not path.is_file():
        raise InputError(f"lab {name!r} has no {path.name}; run gpuforge lab up")
    return dict(json.loads(path.read_text()))


# --- steps of up ---------------------------------------------------------------------------


def _ensure_ssh_key(name: str, sdir: Path, result: UpResult) -> Path:
    key = sdir / "ssh" / "id_ed25519"
    if key.is_file() and key.with_suffix(".pub").is_file():
        return key
    key.parent.mkdir(mode=0o700, exist_ok=True)
    run_cmd(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"gpuforge-lab-{name}",
            "-f",
            str(key),
        ],
        timeout=30,
    )
    key.chmod(0o600)
    result.files_changed.append(str(key))
    return key


def _ensure_network(plan: LabPlan, result: UpResult) -> None:
    if podman.network_exists(plan.network):
        return
    podman.run(
        [
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            plan.subnet,
            "--gateway",
            plan.gateway,
            *[f"--label={k}={v}" for k, v in labels(plan.name).items()],
            plan.network,
        ]
    )
    result.created.append(plan.network)


def _ensure_containers(
    plan: LabPlan, image: str, mirror_dir: Path, result: UpResult, say: Progress
) -> set[str]:
    """Create or start every container; returns the hostnames that were (re)booted."""
    existing = {c.name: c for c in podman.containers(f"{podman.LAB_LABEL}={plan.name}")}
    jobs: list[tuple[str, Callable[[], object]]] = []
    booted: set[str] = set()
    if plan.mirror_name not in existing:
        jobs.append((plan.mirror_name, lambda: _run_mirror(plan, mirror_dir)))
    elif existing[plan.mirror_name].state != "running":
        jobs.append((plan.mirror_name, lambda: podman.start(plan.mirror_name)))
    for node in plan.nodes:
        cname = plan.container(node.hostname)
        if cname not in existing:
            jobs.append((cname, _node_runner(plan, node, image)))
            booted.add(node.hostname)
        elif existing[cname].state != "running":
            jobs.append((cname, lambda c=cname: podman.start(c)))  # type: ignore[misc]
            booted.add(node.hostname)
    if not jobs:
        return booted
    say(f"starting {len(jobs)} containers")
    with ThreadPoolExecutor(max_workers=MAX_PARALLEL) as pool:
        futures = {name: pool.submit(job) for name, job in jobs}
        errors = []
        for cname, future in futures.items():
            try:
                future.result()
            except OperationError as exc:
                errors.append(f"{cname}: {exc}")
            else:
                (result.created if cname not in existing else result.started).append(cname)
    if errors:
        raise OperationError("lab containers failed to start:\n" + "\n".join(errors))
    return booted


def _node_runner(plan: LabPlan, node: LabNode, image: str) -> Callable[[], object]:
    def run() -> object:
        return podman.run_container(
            plan.container(node.hostname),
            image,
            hostname=node.hostname,
            network=plan.network,
            labels=labels(
                plan.name,
                kind="node",
                hostname=node.hostname,
                role=node.role,
                address=node.address,
            ),
            extra=[
                "--ip",
                node.address,
                "--network-alias",
                node.hostname,
                "--network-alias",
                node.fqdn,
                "--systemd=always",
                # `systemctl reboot` in a node ends its systemd; podman starts it again, a new
                # boot (fresh /run, new PID 1) as the simulator and remediation expect.
                "--restart=always",
                # The simulator creates each rail's netdev and networkd configures it.
                "--cap-add=NET_ADMIN",
                "--no-hosts",
                "--stop-timeout",
                "5",
            ],
        )

    return run


def _run_mirror(plan: LabPlan, mirror_dir: Path) -> object:
    if not (mirror_dir / "dists").is_dir():
        raise OperationError(f"no lab mirror at {mirror_dir}; run gpuforge lab mirror")
    return podman.run_container(
        plan.mirror_name,
        LATEST,
        hostname=plan.mirror_name,
        network=plan.network,
        labels=labels(plan.name, kind="mirror", address=plan.mirror_address, role="mirror"),
        volumes=[f"{mirror_dir.resolve()}:{MIRROR_ROOT_IN_CONTAINER}:ro"],
        # A static file server as PID 1 ignores SIGTERM; it holds no state, so kill it outright.
        extra=[
            "--ip",
            plan.mirror_address,
            "--stop-signal",
            "SIGKILL",
            "--user",
            "nobody",
            # Port 80 without root: the file server runs as nobody.
            "--sysctl",
            "net.ipv4.ip_unprivileged_port_start=80",
        ],
        command=[
            "python3",
            "-m",
            "http.server",
            "80",
            "--bind",
            "0.0.0.0",  # noqa: S104 - serves the lab network only
            "--directory",
            MIRROR_ROOT_IN_CONTAINER,
        ],
    )


def _prepare_node(
    plan: LabPlan, node: LabNode, pubkey: bytes, hosts_file: bytes, fresh: bool
) -> tuple[str, bool]:
    """Wait for boot and sshd, install /etc/hosts and the lab key; return (host key, changed)."""
    cname = plan.container(node.hostname)
    deadline = time.monotonic() + BOOT_TIMEOUT
    state = ""
    while time.monotonic() < deadline:
        proc = podman.exec_(
            cname, ["systemctl", "is-system-running", "--wait"], check=False, timeout=BOOT_TIMEOUT
        )
        state = proc.stdout.decode().strip()
        if state in ("running", "degraded"):
            break
        time.sleep(0.5)
    else:
        raise OperationError(f"{cname}: systemd did not finish booting ({state or 'no state'})")
    changed = False
    for path, wanted, mode in (
        ("/etc/hosts", hosts_file, "0644"),
        ("/root/.ssh/authorized_keys", pubkey, "0600"),
    ):
        current = podman.exec_(cname, ["cat", path], check=False).stdout
        data = wanted
        if path == "/etc/hosts":  # the lab's block only: roles add theirs (base's cluster block)
            data = files.with_lab_block(current.decode(errors="replace"), wanted.decode()).encode()
        if current != data:
            podman.put_file(cname, data, path, mode=mode)
            changed = True
    podman.exec_(cname, ["systemctl", "is-active", "--quiet", "ssh"], timeout=30)
    host_key = podman.read_file(cname, "/etc/ssh/ssh_host_ed25519_key.pub").decode().split()
    if len(host_key) < 2:
        raise OperationError(f"{cname}: no SSH host key")
    return f"{host_key[0]} {host_key[1]}", changed or fresh


def _state(plan: LabPlan) -> dict[str, Any]:
    data = asdict(plan)
    data["nodes"] = [asdict(n) for n in plan.nodes]
    return data


def _write_inventory(
    plan: LabPlan, inv: InventoryDir, key: Path, writer: InventoryWriter, result: UpResult
) -> None:
    if (inv.root / "hosts.yml").is_file():
        # The single-directory inventory earlier versions of lab up wrote here: the lab's own.
        shutil.rmtree(inv.root)
    before = _tree_digest(inv.root)
    writer(inv.root)
    if _tree_digest(inv.root) != before:
        result.files_changed.append(str(inv.generated))
    for rel, text in files.site_files(plan, inv.root.parent, key).items():
        path = inv.site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_if_changed(path, text, result)


def _tree_digest(root: Path) -> dict[str, bytes]:
    if not root.is_dir():
        return {}
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _write_if_changed(path: Path, content: str, result: UpResult) -> None:
    data = content.encode()
    if path.is_file() and path.read_bytes() == data:
        return
    write_atomic(path, data, mode=0o600)
    result.files_changed.append(str(path))


def _quiet(_message: str) -> None:
    pass
