"""How many cores this process may use, for the runtimes' thread pools.

``os.cpu_count()`` is the machine's: in a container limited to 2 CPUs on a 64-core node
(``docker run --cpus 2``, a Kubernetes CPU limit) it is 64, and 64 threads on 2 cores'
worth of time are throttled in turn. The limit is the process's CPU affinity (taskset, a
cpuset) capped by its cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), the
smallest over its cgroup and the cgroups above it, rounded up to whole cores.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cores(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota(proc_cgroup, root)
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def limit_torch_threads() -> None:
    """PyTorch's intra-op threads to the cores this process may use, unless
    OMP_NUM_THREADS says how many: its default is every CPU of the node, quota or not.
    For the commands that train or export; the service sets each model's own."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(available_cores())


def cpu_quota(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """This process's cgroup CPU limit in cores; None where there is none (or no cgroups).

    /proc/self/cgroup names the process's cgroup per hierarchy ("0::/path" for v2,
    "N:cpu,cpuacct:/path" for v1). Inside a container the cgroup's folder is usually
    mounted at the hierarchy's root, so the path's folders are looked for from the
    whole path up to the root, and each one found counts."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if not controllers:  # v2
            base, read = root, _v2_limit
        elif "cpu" in controllers.split(","):  # v1
            base, read = root / "cpu", _v1_limit
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            limit = read(base.joinpath(*parts[:depth]))
            if limit is not None:
                limits.append(limit)
    return min(limits, default=None)


def _v2_limit(folder: Path) -> float | None:
    try:  # "max 100000" (none) or "200000 100000" (2 cores)
        quota, period = (folder / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_limit(folder: Path) -> float | None:
    try:  # a quota of -1: none
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None
