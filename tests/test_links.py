"""What the project tells its users to read is in the repository: no file a user meets
(the README, the install's constraints, the Makefile, the Dockerfile, the deployment
manifests, the results pages) points above the repository's root."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USERS_FILES = ["README.md", "constraints.txt", "pyproject.toml", "Makefile", "Dockerfile",
               "bench/REPORT.md", "loadtests/RESULTS.md", "loadtests/GPU_RESULTS.md"]


def test_no_users_file_points_outside_the_repository():
    files = [ROOT / f for f in USERS_FILES] + sorted((ROOT / "deploy").rglob("*.yaml"))
    outside = []
    for file in files:
        for n, line in enumerate(file.read_text().splitlines(), 1):
            if re.search(r"(^|[\s(`'\"])\.\./", line):
                outside.append(f"{file.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not outside, "\n".join(outside)
