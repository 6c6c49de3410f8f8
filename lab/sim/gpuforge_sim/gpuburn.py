"""Simulated wilicc/gpu-burn ``gpu_burn``; like the real one it exits 0 even with a FAULTY GPU."""

from __future__ import annotations

import time

from . import SIM_BANNER
from .gpu import GpuHealth, gpu_health, throttled
from .state import SimError, driver_version, load_lab


def _burn_temp(g: GpuHealth, jitter: int) -> int:
    return g.temp_c if g.reasons["hw_thermal_slowdown"] else g.temp_c + 25 + jitter


def main(argv: list[str]) -> int:  # noqa: PLR0912, PLR0915 - options, then the report
    seconds = 10
    doubles = tensor = listing = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print("GPU Burn")
            print("Usage: gpu_burn [OPTIONS] [TIME]\n")
            print("-m X\tUse X MB of memory.\n-m N%\tUse N% of the available GPU memory.")
            print("-d\tUse doubles\n-tc\tTry to use Tensor cores\n-l\tLists all GPUs in the system")
            print("-i N\tExecute only on GPU N\n-c FILE\tUse FILE as compare kernel.")
            print(f"-h\tShow this help message\n\n({SIM_BANNER})")
            return 0
        if a == "-d":
            doubles = True
        elif a == "-tc":
            tensor = True
        elif a == "-l":
            listing = True
        elif a in ("-m", "-i", "-c", "-stts"):
            i += 1
        elif a.isdigit():
            seconds = int(a)
        i += 1
    lab = load_lab()
    node = lab.local()
    driver_version()
    gpus = gpu_health(node)
    if listing:
        for g in gpus:
            print(
                f"ID {g.index}: {g.sku.product_name}, "
                f"{g.sku.fb_total_mib - g.sku.fb_reserved_mib}MB"
            )
        return 0
    if node.has("fabricmanager_down") and node.sku is not None and node.sku.nvswitch:
        raise SimError('Couldn\'t init a GPU test: Error in "init": CUDA_ERROR_SYSTEM_NOT_READY', 1)
    print("Using compare file: compare.ptx")
    print(f"Burning for {seconds} seconds.")
    for g in gpus:
        print(f"GPU {g.index}: {g.sku.product_name} (UUID: {g.uuid})")
    rng = node.rng("burn")
    gflops = []
    for g in gpus:
        base = g.sku.burn_gflops * (0.5 if doubles else 1.0) * (1.9 if tensor else 1.0)
        if throttled(g):
            base *= 0.62
        base *= g.compute_factor
        gflops.append(base * (1 + rng.uniform(-0.015, 0.015)))
    steps = 10
    errors = [0 for _ in gpus]
    iters_per_step = [int(gf * seconds / steps / 34.4) for gf in gflops]
    done = [0 for _ in gpus]
    for step in range(1, steps + 1):
        lab.sleep(seconds / steps)
        for k, g in enumerate(gpus):
            done[k] += iters_per_step[k]
            if g.burn_faulty:
                errors[k] += 524288 * step
        procd = " - ".join(f"{done[k]} ({int(gflops[k])} Gflop/s)" for k in range(len(gpus)))
        errs = " - ".join(f"{e}  (WARNING!)" if e else "0" for e in errors).replace(
            "(WARNING!) -", "(WARNING!)-"
        )
        temps = " - ".join(f"{_burn_temp(g, rng.randint(0, 4))} C" for g in gpus)
        print(f"{step * 100.0 / steps:.1f}%  proc'd: {procd}   errors: {errs}   temps: {temps} ")
    print(f"\tSummary at:   {time.strftime('%a %b %e %H:%M:%S UTC %Y', time.gmtime())}")
    print("")
    print("Killing processes.. ", end="")
    prec = "DOUBLES" if doubles else "FLOATS"
    tc = ", using Tensor Cores" if tensor else ""
    for g in gpus:
        avail = g.sku.fb_total_mib - g.sku.fb_reserved_mib - 50
        print(
            f"Initialized device {g.index} with {g.sku.fb_total_mib - g.sku.fb_reserved_mib} MB of "
            f"memory ({avail} MB available, using {int(avail * 0.9)} MB of it), using {prec}{tc}"
        )
        print("Results are 268435456 bytes each, thus performing 268 iterations")
        print(f"Freed memory for dev {g.index}")
        print("Uninitted cublas")
    print("done")
    print("")
    print(f"Tested {len(gpus)} GPUs:")
    for k, g in enumerate(gpus):
        print(f"\tGPU {g.index}: {'FAULTY' if errors[k] else 'OK'}")
    return 0
