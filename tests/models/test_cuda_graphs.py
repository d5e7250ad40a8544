"""CUDA graphs (distilserve/models/runtime/cuda_graphs.py): which batches a graph takes, and that a
batch padded up to a graph's shape gives every family's and task's outputs unchanged. On
the CPU a stand-in records nothing and replays by running the forward pass again into the
same output buffer, from the same input buffer: a graph's contract without CUDA. The tests
marked gpu capture real graphs."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from distilserve.models.io import checkpoint
from distilserve.models.runtime import open_backend
from distilserve.models.runtime.base import INPUT_NAMES
from distilserve.models.runtime.cuda_graphs import CudaCapture, Graphs
from distilserve.models.runtime.torch import TorchBackend
from distilserve.server.core.batching import pad
from distilserve.server.core.runner import warmup_shapes
from tests.conftest import FAMILIES, TASKS

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
SHAPES = [(1, 8), (2, 8), (4, 8), (4, 16), (8, 16), (8, 32)]


class StandIn:
    """capture() without CUDA: replaying runs the forward pass again into the buffer."""

    def __init__(self):
        self.captured = 0

    def __call__(self, run):
        self.captured += 1
        out = run()
        return (lambda: out.copy_(run())), out


def _batch(rng, lengths: list[int]) -> dict[str, np.ndarray]:
    """Random token ids of these lengths, padded as the service pads a batch."""
    return pad([SimpleNamespace(ids=rng.integers(1000, 30000, n).tolist(), type_ids=[0] * n)
                for n in lengths])


def _stacked(arrays) -> torch.Tensor:
    return torch.from_numpy(np.stack([arrays[k] for k in INPUT_NAMES]))  # [3, B, T]


def test_a_batch_goes_to_the_smallest_shape_that_holds_it():
    graphs = Graphs(lambda *x: None, SHAPES, StandIn())
    assert graphs.shape(1, 3) == (1, 8)
    assert graphs.shape(3, 8) == (4, 8)
    assert graphs.shape(3, 9) == (4, 16)
    assert graphs.shape(5, 17) == (8, 32)
    assert graphs.shape(9, 4) is None and graphs.shape(1, 33) is None  # runs without one


def test_the_engines_shapes_cover_every_batch_up_to_the_token_limit():
    """What the engine gives (the warm-up's shapes up to DISTILSERVE_CUDA_GRAPH_TOKENS)
    holds every batch within the batch limits whose padded shape is that small."""
    graphs = Graphs(lambda *x: None, warmup_shapes(256, 65_536, 384), StandIn(), 4096)
    for b in range(1, 257):
        for t in range(1, 385):
            shape = graphs.shape(b, t)
            if shape is not None:
                assert shape[0] >= b and shape[1] >= t and shape[1] <= 384
                assert shape[0] * shape[1] <= 4096
            padded = (1 << (b - 1).bit_length()) * max(8, 1 << (t - 1).bit_length())
            if padded <= 4096:
                assert shape is not None, (b, t)


@pytest.fixture(scope="module")
def backends(tiny_checkpoints):
    """(family, task) -> the torch backend of its tiny checkpoint, on the CPU."""
    return {key: TorchBackend(Path(folder)) for key, folder in tiny_checkpoints.items()}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_up_to_a_graphs_shape_every_model_gives_the_same_outputs(backends, family,
                                                                        task):
    backend = backends[family, task]
    capture = StandIn()
    graphs = Graphs(backend.forward, SHAPES, capture)
    rng = np.random.default_rng(0)
    # a long batch, then shorter ones of the same shape: nothing of the first stays
    for lengths in ([16, 9, 12, 16], [10, 4, 7], [5, 3], [6], [20, 30, 7, 25, 11]):
        arrays = _batch(rng, lengths)
        with torch.inference_mode():
            got = graphs.run(_stacked(arrays))
        want = backend.run(arrays)
        assert got is not None and got.shape == want.shape
        if task == "ner":  # only the real tokens count, as the engine takes them
            for row, n in enumerate(lengths):
                np.testing.assert_allclose(got[row, :n].numpy(), want[row, :n], atol=2e-5)
        else:
            np.testing.assert_allclose(got.numpy(), want, atol=2e-5)
    assert set(graphs.graphs) == {(4, 16), (2, 8), (1, 8), (8, 32)}
    assert capture.captured == 4  # (4, 16) once, for two batches


def test_a_capture_that_fails_ends_the_capturing_and_says_what_failed_first(caplog):
    """torch raises from capture_end when a recording failed, its error chained to what
    failed first: the warning gives both; the graphs captured before it stay in use, and
    nothing is recorded after it (torch's pool is left recording)."""
    tried = []

    def capture(run):
        tried.append(True)
        if len(tried) > 1:  # as torch raises it: from capture_end, while handling the first
            failed = RuntimeError("CUDA error: operation failed due to a previous error "
                                  "during capture\nSearch for `cudaErrorStreamCapture`")
            failed.__context__ = RuntimeError("CUDA error: operation not permitted when "
                                              "stream is capturing\nCompile with `TORCH_USE_CUDA_DSA`")
            raise failed
        return StandIn()(run)

    graphs = Graphs(lambda *x: x[0].float(), SHAPES, capture)
    small, large = torch.ones((3, 2, 5), dtype=torch.int64), torch.ones((3, 4, 12), dtype=torch.int64)
    with caplog.at_level(logging.WARNING, logger="distilserve"):
        assert graphs.run(small) is not None  # (2, 8) captured
        assert graphs.run(large) is None  # (4, 16) fails
        assert graphs.run(large) is None and graphs.run(torch.ones((3, 1, 3))) is not None
    assert len(tried) == 2 and set(graphs.graphs) == {(2, 8)}
    assert graphs.shape(1, 3) == (2, 8)  # the smallest captured shape that holds it
    assert [r.getMessage() for r in caplog.records] == [
        "no CUDA graph for batches of 4 x 16, nor for any shape not yet captured (1 "
        "captured): they run without one: RuntimeError: CUDA error: operation failed due to "
        "a previous error during capture (after RuntimeError: CUDA error: operation not "
        "permitted when stream is capturing)"]


@pytest.mark.parametrize("family,task", [(f, t) for f in FAMILIES for t in TASKS] + [
    (f, t) for f in ("bert", "distilbert") for t in ("qa", "fill-mask")])
def test_no_forward_pass_reads_a_tensor_on_the_host(tiny_checkpoints, family, task, tmp_path):
    """A CUDA graph cannot record a read of a tensor's value on the host (``if
    torch.all(mask == 1)``, ``.item()``), and outside a graph each such read waits for the
    GPU. On the meta device every one of them raises: each family's forward pass runs
    there whole (transformers' own BERT mask read is replaced: distilserve/models/bert.py)."""
    folder = tiny_checkpoints.get((family, task)) or checkpoint.save(
        checkpoint.new(family, "tiny", task), tmp_path / task)
    model = checkpoint.load(Path(folder), task).model.to("meta")
    ids = torch.ones((2, 5), dtype=torch.int64, device="meta")  # [B, T]
    with torch.inference_mode():
        out = model(ids, ids, ids)
    assert out.device.type == "meta" and out.shape[0] == 2


def test_only_a_pytorch_backend_on_a_gpu_uses_graphs(exports, backends, tiny_checkpoints, tmp_path):
    assert backends["bert", "embed"].use_graphs(SHAPES) is False  # on the CPU
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "onnx", "onnx")
    assert open_backend("onnx", tmp_path / "onnx", "model.onnx").use_graphs(SHAPES) is False


def _same_with_graphs(plain, graphed, task: str, label: str) -> None:
    """``graphed`` (a backend with graphs for SHAPES) gives what ``plain`` gives."""
    assert graphed.use_graphs(SHAPES)
    rng = np.random.default_rng(0)
    for lengths in ([16, 9, 12, 16], [10, 4, 7], [6], [5] * 9):
        arrays = _batch(rng, lengths)
        want, got = plain.run(arrays), graphed.run(arrays)
        assert got.shape == want.shape, label
        for row, n in enumerate(lengths):  # per token: the real tokens
            a, b = (want[row, :n], got[row, :n]) if task == "ner" else (want[row], got[row])
            # the same dtype; other shapes may take other kernels, so not bit for bit
            assert np.linalg.norm(b - a) <= 3e-2 * np.linalg.norm(a) + 1e-3, (label, row)
    assert set(graphed.place.graphs.graphs) == {(4, 16), (1, 8)}, label  # 9 rows: none


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("task", TASKS)
def test_on_cuda_graphs_give_what_the_eager_model_gives_without(tiny_checkpoints, task):
    for family in FAMILIES:
        folder = Path(tiny_checkpoints[family, task])
        plain, graphed = (TorchBackend(folder, device="cuda", dtype="auto") for _ in range(2))
        _same_with_graphs(plain, graphed, task, family)


@pytest.fixture(scope="module")
def torchscript(exports, tiny_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """family -> its tiny embed checkpoint exported to TorchScript (for the gpu tests)."""
    root = tmp_path_factory.mktemp("torchscript")
    for family in FAMILIES:
        exports(tiny_checkpoints[family, "embed"], root / family, "torchscript")
    return {family: root / family for family in FAMILIES}


@pytest.mark.gpu
@CUDA
def test_on_cuda_graphs_give_what_torchscript_gives_without(torchscript):
    for family in FAMILIES:
        plain, graphed = (open_backend("torchscript", torchscript[family], "model.ts",
                                       device="cuda", dtype="auto") for _ in range(2))
        _same_with_graphs(plain, graphed, "embed", family)


@pytest.mark.gpu
@CUDA
def test_on_cuda_a_failed_capture_puts_the_threads_stream_back():
    """torch's graph context leaves its side stream current when the recording fails; the
    batches after it must run on the stream they ran on before."""
    before = torch.cuda.current_stream()
    x = torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError):
        CudaCapture()(lambda: x * (x.sum().item() > 0))  # .item(): a read on the host
    assert torch.cuda.current_stream() == before
    assert (x + 1).sum().item() == 8  # the GPU still works


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("graphs", [False, True], ids=["plain", "graphs"])
def test_on_cuda_launching_a_batch_waits_for_nothing(tiny_checkpoints, torchscript, graphs):
    """The one wait per batch is ``collect``'s: with PyTorch's sync debug mode at error,
    any op that waits for the GPU while batches are launched raises (a host read in a
    forward pass, a copy from pageable memory). Every family, eager and TorchScript, once
    each shape has run (TorchScript profiles a new shape, a graph is captured)."""
    rng = np.random.default_rng(0)
    batches = [_batch(rng, lengths) for lengths in ([16, 9, 12, 16], [5, 3], [6])]
    for family in FAMILIES:
        for backend in (TorchBackend(Path(tiny_checkpoints[family, "embed"]), device="cuda",
                                     dtype="auto"),
                        open_backend("torchscript", torchscript[family], "model.ts",
                                     device="cuda", dtype="auto")):
            if graphs:
                assert backend.use_graphs(SHAPES)
            want = [backend.run(arrays) for arrays in batches for _ in range(2)][1::2]
            torch.cuda.set_sync_debug_mode("error")
            try:
                launched = [backend.launch(arrays) for arrays in batches[:2]]  # two in flight
            finally:
                torch.cuda.set_sync_debug_mode("default")
            for got, expected in zip(launched, want):
                np.testing.assert_allclose(backend.collect(got), expected, atol=1e-3)
