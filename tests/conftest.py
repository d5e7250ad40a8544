"""Shared fixtures: tiny checkpoints of every family and task, built once per session, and
the model folders exported from them, each export made once per run."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the suite compares outputs with fp32 references at fp32 tolerances, on machines with and
# without bf16 matrix units alike; what auto chooses is tested where it is the subject
os.environ.setdefault("DISTILSERVE_DTYPE", "fp32")

from distilserve.models import families  # noqa: E402
from distilserve.models.runtime.cores import available_cores  # noqa: E402
from loadtests.run import (  # noqa: E402, F401 (tests' too)
    free_port,
    unallocated_port,
    wait_until_ready,
)


def own_cores() -> int:
    """How many cores this process has. Under pytest-xdist a worker takes its share of
    them as its CPU affinity (the servers it starts inherit it and size their thread pools
    by it), so that no two workers' thread pools share a core: each would wait, at every
    parallel operation, for its threads that the other's had pushed off."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and hasattr(os, "sched_setaffinity"):  # (Linux)
        cores = sorted(os.sched_getaffinity(0))
        n = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
        os.sched_setaffinity(0, cores[n * len(cores) // workers:(n + 1) * len(cores) // workers]
                             if workers <= len(cores) else [cores[n % len(cores)]])
    return available_cores()


def _exit_at_once() -> None:
    """The last exit handler of a pytest-xdist worker, its results sent and every other
    handler run: ends the process without tearing its modules down one by one (slow with
    torch and transformers loaded, and pytest-xdist's controller waits for it)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pytest_sessionstart(session):
    """In a process that runs tests (not pytest-xdist's controller, which hands them out
    and so imports no model code): its cores, torch's threads on them, and in a worker
    its exit at once."""
    import xdist

    if xdist.is_xdist_controller(session):
        return
    if xdist.is_xdist_worker(session):  # before what the tests import registers its own
        atexit.register(_exit_at_once)
    import torch

    torch.set_num_threads(min(2, own_cores()))


FAMILIES = families.FAMILIES
TASKS = ("embed", "classify", "ner")


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[tuple[str, str], str]:
    """(family, task) -> folder of a saved tiny checkpoint."""
    from distilserve.models.io import checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for family in FAMILIES:
        for task in TASKS:
            labels = ["negative", "positive"] if task == "classify" else None
            ckpt = checkpoint.new(family, "tiny", task, labels)
            out[family, task] = str(checkpoint.save(ckpt, root / f"{family}-{task}"))
    return out


class Exports:
    """``distilserve.models.export.export`` for the tests whose subject is not the export:
    each distinct export (the source folder's files, the format, the loop form and the
    options) is made once per run, in a folder that pytest-xdist's workers share, and
    copied to where a test asks for it (its manifest naming the source asked for). Not for
    a folder a running service watches: a copy is not put in place at once, as an export is.

    A copy's files of a mebibyte or more (artifacts, weights) are hard links to the run's
    one export (``copy``): a test may change the small files of its copy, and remove or
    replace any file (unlink it, then write), but never write into a large one, which
    would change every copy; ``check_untouched`` fails the run where one was."""

    LINKED_FROM = 1 << 20  # bytes

    def __init__(self, root: Path):
        self.root = root
        self.linked: dict[str, int] = {}  # a file linked -> its mtime (ns) then

    def __call__(self, source, output, fmt: str = "onnx", loop: str = "unroll", **options):
        from distilserve.models import export
        from distilserve.models.io.manifest import Manifest

        source, output = Path(source), Path(output)
        key = hashlib.sha256(repr((fmt, loop, sorted(options.items()))).encode())
        for file in sorted(p for p in source.rglob("*") if p.is_file()):
            key.update(str(file.relative_to(source)).encode() + b"\0" + file.read_bytes())
        made = self.root / key.hexdigest()[:24]
        if not made.exists():
            staging = self.root / f".{made.name}.{os.getpid()}"
            export.export(source, staging, fmt, loop, **options)
            with contextlib.suppress(OSError):  # another worker's came first: that one
                staging.rename(made)
            shutil.rmtree(staging, ignore_errors=True)
        self.copy(made, output)
        manifest = Manifest.read(output)
        if manifest.source != str(source):  # made from another worker's copy of it
            manifest = manifest.model_copy(update={"source": str(source)})
            manifest.write(output)
        return manifest

    def copy(self, folder, to) -> None:
        """``shutil.copytree``, with the large files linked."""
        def place(src: str, dst: str) -> None:
            if os.path.getsize(src) < self.LINKED_FROM:
                shutil.copy2(src, dst)
                return
            os.link(src, dst)
            self.linked.setdefault(src, os.stat(src).st_mtime_ns)

        shutil.copytree(folder, to, copy_function=place)

    def check_untouched(self) -> None:
        written = [f for f, mtime in self.linked.items()
                   if os.path.exists(f) and os.stat(f).st_mtime_ns != mtime]
        assert not written, (f"a test wrote into {written}, linked to its copies of a model "
                             "folder (conftest.Exports): replace a file rather than write into it")


def shared_folder(tmp_path_factory) -> Path:
    """The run's temporary folder, which pytest-xdist's workers share (each worker's own
    is in it)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> Exports:
    root = shared_folder(tmp_path_factory) / "exports"
    root.mkdir(exist_ok=True)
    made = Exports(root)
    yield made
    made.check_untouched()


@pytest.fixture(scope="session")
def oip_repository(tiny_checkpoints, exports, tmp_path_factory):
    """A repository for the Open Inference Protocol's tests (HTTP and gRPC), read only: a
    tiny BERT of each of embed, classify and ner in ONNX, and a broken folder (no
    manifest: not served, and said so)."""
    repo = tmp_path_factory.mktemp("oip")
    for task in ("embed", "classify", "ner"):
        exports(tiny_checkpoints["bert", task], repo / task, "onnx", check=False)
    (repo / "broken").mkdir()
    return repo


@pytest.fixture(scope="session")
def splade_checkpoint(tmp_path_factory):
    """A tiny SPLADE model as sentence-transformers saves one: a BERT masked-language model
    (random weights, the bert-base-uncased vocabulary) and its SpladePooling module."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM

    from distilserve.models.io import checkpoint

    root = tmp_path_factory.mktemp("splade")
    torch.manual_seed(3)
    BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=128)
                    ).save_pretrained(root / "mlm")
    for name in checkpoint.TOKENIZER_FILES:
        if (checkpoint.default_tokenizer_dir() / name).exists():
            shutil.copy(checkpoint.default_tokenizer_dir() / name, root / "mlm" / name)
    SparseEncoder(modules=[Transformer(str(root / "mlm"), transformer_task="fill-mask"),
                           SpladePooling("max")], device="cpu").save(str(root / "splade"))
    return root / "splade"


@pytest.fixture(scope="session")
def embedded_default(tmp_path_factory):
    """(cache, folder): the embedded default built once on an empty cache, for the tests of
    the build and the documentation's examples alike. Under pytest-xdist the workers share
    the cache: the first to need it builds it, under the build's lock, while any other
    waits for it."""
    from distilserve.server import embedded_default as default

    cache = shared_folder(tmp_path_factory) / "embedded-default-cache"
    return cache, default.ensure_default_repository(cache)


@pytest.fixture(scope="session")
def tiktoken_cache(tmp_path_factory):
    """A TIKTOKEN_CACHE_DIR holding tiktoken's cl100k_base, from the table bpe-openai ships:
    the same file as tiktoken's download, which tiktoken checks by its hash."""
    import gzip
    import hashlib
    from importlib import resources

    cache = tmp_path_factory.mktemp("tiktoken")
    blob = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    table = resources.files("bpe_openai.data").joinpath("cl100k_base.tiktoken.gz")
    (cache / hashlib.sha1(blob.encode()).hexdigest()).write_bytes(
        gzip.decompress(table.read_bytes()))
    return cache


def batch(batch_size: int = 3, length: int = 11, seed: int = 0, pad_row: int | None = 1):
    """Random token ids with one row padded to about half its length."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (batch_size, length), generator=g)
    mask = torch.ones_like(ids)
    if pad_row is not None and batch_size > pad_row:
        mask[pad_row, length // 2:] = 0
        ids[pad_row, length // 2:] = 0
    return ids, mask, torch.zeros_like(ids)


@contextlib.contextmanager
def said_to(name: str):
    """The messages logged to the logger ``name`` itself within the block (after its own
    filters), as they come."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def wait_for(condition, what: str, seconds: float = 600):
    """Polls until ``condition()`` is truthy and returns it: a bound for a hung process,
    not for a slow machine."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def transformers_pipeline(task: str, folder, family: str):
    """transformers' pipeline for ``task`` on the checkpoint in ``folder``. The tokenizer
    the tiny checkpoints carry is BERT's, whose token_type_ids DistilBERT does not take (a
    published DistilBERT's tokenizer leaves them out)."""
    from transformers import AutoTokenizer, pipeline

    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if family == "bert" else [])
    return pipeline(task, model=str(folder), device="cpu",
                    tokenizer=AutoTokenizer.from_pretrained(str(folder), model_input_names=names))


@contextlib.contextmanager
def running_server(repository, until: str = "/ready", **settings):
    """A real uvicorn server on 127.0.0.1 and a free port, in a thread; yields its URL
    once ``until`` (/ready) answers 200, and stops it afterwards."""
    with serving(repository, until, **settings) as (url, _):
        yield url


@contextlib.contextmanager
def serving(repository, until: str = "/ready", **settings):
    """running_server's server, yielded with its URL: ``(url, server)``."""
    from distilserve.server.app import create_app
    from distilserve.server.connections import Config, Server
    from distilserve.server.settings import Settings

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings(port=port, **settings)
    server = Server(Config(create_app(settings, repository), settings, host="127.0.0.1",
                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url, thread.is_alive, "the test server", until)
    try:
        yield url, server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def terminate(server, pids: list[int]) -> None:
    """SIGTERM to a server's process, which must exit with 0 within two minutes (killed
    otherwise), leaving none of ``pids`` (its workers, its engine process) running."""
    import signal
    import subprocess

    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(120)
    except subprocess.TimeoutExpired:
        server.kill()
        raise
    assert code == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or \
            "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
