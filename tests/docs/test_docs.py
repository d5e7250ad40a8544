"""The documentation: the README is short, the MkDocs site builds strictly (no broken
link, no page outside the navigation), and every example of the site and the README runs
against a real service and prints what the page says it prints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import unallocated_port, wait_until_ready
from tests.docs.examples import SERVE, Page, matches, read, shell_lines, with_ports

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
BIN = Path(sys.executable).parent


def test_readme_is_short_and_keeps_the_test_command():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make test" in readme and "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    site = tmp_path / "site"
    assert (site / "search" / "search_index.json").exists()  # the search plugin's index
    settings = (site / "reference" / "settings" / "index.html").read_text()
    assert "DISTILSERVE_MAX_BATCH_TOKENS" in settings and "DISTILSERVE_TOKEN_IDS" in settings
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "--relevant-label" in cli and "--any-depth" in cli
    document = json.loads((site / "reference" / "openapi.json").read_text())
    assert {"/v1/embeddings", "/v2/models/{model_name}/infer", "/rerank"} <= set(document["paths"])


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_that_is_not_run_says_why(path):
    page = read(path)
    assert all(b.not_run.strip() for b in page.blocks if b.not_run is not None)


def test_the_manifest_page_names_every_field():
    from distilserve.models.io.manifest import Manifest

    page = (ROOT / "docs" / "reference" / "manifest.md").read_text()
    assert [f for f in Manifest.model_fields if f"`{f}`" not in page] == []


def test_output_matching():
    assert matches('{"a": [0.13..., ...], "b": 2}', '{"a":[0.1302,-0.5],\n "b":2}')
    assert not matches('{"a": 1}', '{"a": 12}')
    assert matches("384", "384\n")


@pytest.fixture(scope="module")
def environment(embedded_default, tiktoken_cache, tmp_path_factory):
    """The examples' environment: a cache of their own holding the built default (what
    they add there, a distillation's corpus, is theirs), the test's tiktoken table."""
    cache = tmp_path_factory.mktemp("examples-cache")
    (cache / embedded_default[1].name).symlink_to(embedded_default[1])
    return {**os.environ, "DISTILSERVE_CACHE_DIR": str(cache), "TIKTOKEN_CACHE_DIR":
            str(tiktoken_cache), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


class Services:
    """The page's services, started from its `distilserve serve` lines, stopped at the end."""

    def __init__(self, env: dict, logs: Path):
        self.env, self.logs, self.processes = env, logs, []

    def start(self, line: str, http: int) -> None:
        log = (self.logs / f"service-{len(self.processes)}.log").open("w")
        settings, command = SERVE.match(line).group(1, 2)
        process = subprocess.Popen(["bash", "-c", f"{settings}exec distilserve serve{command}"],
                                   cwd=self.logs,
                                   env={**self.env, "DISTILSERVE_PORT": str(http)},
                                   stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        try:
            wait_until_ready(f"http://127.0.0.1:{http}", lambda: process.poll() is None, line)
        except RuntimeError as e:  # with what the service said
            raise AssertionError(f"{e}:\n{Path(log.name).read_text()[-3000:]}") from None

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(120)  # its drain
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def default_service(environment, tmp_path_factory):
    """The embedded default, for the pages that start no service of their own."""
    services = Services(environment, tmp_path_factory.mktemp("default-service"))
    ports = unallocated_port(), unallocated_port()
    services.start(f"distilserve serve --grpc-port {ports[1]}", ports[0])
    yield ports
    services.stop()


def run(block_code: str, language: str, cwd: Path, env: dict) -> str:
    command = ["bash", "-eo", "pipefail", "-c", block_code]
    if language == "python":  # a client: huggingface_hub's, under HF_HUB_OFFLINE, calls no URL
        command = [sys.executable, "-c", block_code]
        env = {k: v for k, v in env.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def shell_steps(code: str) -> list[tuple[str, str]]:
    """('serve', line) for a line starting the service, ('run', script) for what is
    between, continuation lines joined."""
    steps, script = [], []
    for line in shell_lines(code):
        if SERVE.match(line.strip()):
            steps += [("run", "\n".join(script))] if script else []
            steps.append(("serve", line.strip()))
            script = []
        else:
            script.append(line)
    return steps + ([("run", "\n".join(script))] if script else [])


EXAMPLES = [p for p in PAGES if read(p).runnable]


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples(path, environment, request, tmp_path):
    page: Page = read(path)
    services = Services(environment, tmp_path)
    if page.starts_a_server:
        http, grpc = unallocated_port(), unallocated_port()
    else:
        http, grpc = request.getfixturevalue("default_service")
    try:
        for block in page.runnable:
            code = with_ports(block.code, http, grpc)
            where = f"{path.relative_to(ROOT)}:{block.line}"
            printed = ""
            steps = shell_steps(code) if block.language == "sh" else [("run", code)]
            for kind, text in steps:
                if kind == "serve":
                    services.start(text, http)
                else:
                    printed += run(text, block.language, tmp_path, environment)
            if block.output is not None:
                assert matches(block.output, printed), f"{where} printed\n{printed}"
    finally:
        services.stop()
