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


def test_no_docs_page_links_outside_the_repository():
    outside = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" in target:
                continue
            if not (page.parent / target).resolve().is_relative_to(ROOT):
                outside.append(f"{page.relative_to(ROOT)}: {target}")
    assert not outside, "\n".join(outside)
