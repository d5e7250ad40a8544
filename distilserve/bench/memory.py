"""A process's memory, from /proc/self/status (Linux)."""

from __future__ import annotations

import resource


def status_mb(field: str) -> float | None:
    """A memory figure of /proc/self/status in MB (VmRSS: resident now, VmHWM: its peak);
    None where there is none."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory. Not getrusage's ru_maxrss: Linux carries that
    over from the parent through fork, so a child would report the harness's own peak."""
    peak = status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
