"""Whether this CPU has matrix units that compute in bf16 faster than in fp32: Intel's
AMX (``amx_bf16``, Sapphire Rapids and later), AVX-512 BF16 (``avx512_bf16``: Intel since
Cooper Lake, AMD since Zen 4) and Arm's BF16 extension (``bf16``: Neoverse V1 and V2,
Graviton 3 and 4). Read from the features the kernel lists in /proc/cpuinfo, so that
telling needs neither torch nor a measurement; elsewhere than Linux: none known.
"""

from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# (feature, what it is), best first: x86's "flags" line, Arm's "Features" line
BF16_UNITS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("bf16", "Arm BF16"))
KNOWN = "AMX, AVX-512 BF16 or Arm BF16"


def bf16_units_in(cpuinfo: str) -> str | None:
    """The bf16 matrix units that a /proc/cpuinfo text lists, e.g. ``AMX (amx_bf16)``;
    None if it lists none."""
    features: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            features.update(value.split())
    return next((f"{name} ({flag})" for flag, name in BF16_UNITS if flag in features), None)


@functools.cache
def bf16_units() -> str | None:
    """This machine's bf16 matrix units (``bf16_units_in`` of its /proc/cpuinfo)."""
    try:
        return bf16_units_in(CPUINFO.read_text())
    except OSError:  # not Linux, or no /proc
        return None
