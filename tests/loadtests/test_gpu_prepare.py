"""The lent GPU machine has few packages and no network: loadtests/gpu_prepare.sh carries
the rest as wheels. What loadtests/gpu.sh's steps import must be on that machine or among
those wheels, else a scarce device call fails at its first import (as fastapi-offline and
python-json-logger would have). Checked here in a subprocess where a module of any other
distribution fails to import, as it does there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # imports every GPU step in subprocesses

ROOT = Path(__file__).parents[2]

# On the machine (../shared/gpu/prepare.sh's header), with what those need, and what
# transformers needed there in the H100 runs
MACHINE = """torch filelock fsspec jinja2 markupsafe networkx sympy mpmath typing-extensions
numpy onnx protobuf ml-dtypes onnxruntime coloredlogs humanfriendly flatbuffers packaging
httpx httpcore h11 anyio idna sniffio certifi psutil pytest iniconfig pluggy
prometheus-client uvloop rich markdown-it-py mdurl pygments
safetensors regex pyyaml tqdm requests charset-normalizer urllib3"""
# What ../shared/gpu/prepare.sh downloads, with their dependencies
PREPARED = """transformers tokenizers huggingface-hub faker fastapi starlette annotated-doc
pydantic pydantic-core annotated-types typing-inspection pydantic-settings python-dotenv
uvicorn click orjson httptools opentelemetry-api importlib-metadata zipp"""
# What gpu.sh's steps run: the service (its engine process too), the peer comparison and
# its profile, the layouts' comparison, the bench, and the test files of its tests step
# (with their conftest)
STEPS = ["distilserve.server.cli", "distilserve.server.app",
         "distilserve.server.engine_process.process", "loadtests.peer", "loadtests.engines",
         "loadtests.engine_alone",
         "loadtests.profile", "distilserve.bench.harness", "distilserve.bench.worker",
         "distilserve.bench.report", "tests.conftest"] + [
    file.removesuffix(".py").replace("/", ".") for file in
    re.findall(r"(?<![\w/])tests/[\w/]+\.py", (ROOT / "loadtests" / "gpu.sh").read_text())]


def extra() -> list[str]:
    """gpu_prepare.sh's EXTRA: the wheels it adds for the project."""
    script = (ROOT / "loadtests" / "gpu_prepare.sh").read_text()
    return re.search(r'^EXTRA="([^"]*)"', script, re.M).group(1).split()


def lent_site(folder: Path, allowed: list[str]) -> Path:
    """A site-packages of these distributions alone: a link to each of their installed
    files here (file by file: a namespace package, such as opentelemetry, holds only the
    allowed distributions' modules)."""
    for name in allowed:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here, nothing for the steps to find either
        for file in dist.files or []:
            source = Path(dist.locate_file(file))
            if file.parts[0] != ".." and source.is_file():
                (folder / file).parent.mkdir(parents=True, exist_ok=True)
                if not (folder / file).exists():
                    (folder / file).symlink_to(source)
    return folder


def imports(tmp_path: Path, allowed: list[str]) -> subprocess.CompletedProcess:
    """Imports STEPS with the standard library, the project and ``allowed`` only (-S: no
    site-packages)."""
    site = lent_site(tmp_path, allowed)
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    return subprocess.run([sys.executable, "-S", "-c", code, *STEPS], cwd=ROOT,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})


def test_the_gpu_steps_import_with_the_machines_packages_and_the_carried_wheels(tmp_path):
    run = imports(tmp_path, MACHINE.split() + PREPARED.split() + extra())
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_check_fails_without_the_extra_wheels(tmp_path):
    """fastapi-offline left out, the service's import fails as it would on the machine."""
    run = imports(tmp_path, MACHINE.split() + PREPARED.split()
                  + [d for d in extra() if d != "fastapi-offline"])
    assert run.returncode != 0 and "No module named 'fastapi_offline'" in run.stderr
