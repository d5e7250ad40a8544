"""The runtime backends' devices and dtypes: choosing them, refusing what cannot be had,
and running the torch and TorchScript backends in fp16 and bf16 (on the CPU here; on CUDA
in the tests marked gpu)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from distilserve.models import export
from distilserve.models.io.manifest import Manifest
from distilserve.models.runtime import base, matrix_units, open_backend, selection, torch_device
from distilserve.models.runtime.base import INPUT_NAMES, BackendError, check_device, choose_dtype
from distilserve.models.runtime.onnx import has_cuda_provider
from distilserve.models.runtime.torchscript import FusedOnTheCpu, TorchScriptBackend

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")


def test_auto_dtype_is_half_on_a_gpu_as_the_model_allows():
    assert choose_dtype("auto", "cuda", ("fp32", "fp16", "bf16"))[0] == "fp16"
    assert choose_dtype("auto", "cuda", ("fp32", "bf16"))[0] == "bf16"  # CMOW
    assert choose_dtype("auto", "cuda", ("fp32",)) == (
        "fp32", "auto: fp32 on a GPU, the model runs in neither fp16 nor bf16")
    assert choose_dtype("fp32", "cuda", ("fp32", "bf16")) == (
        "fp32", "asked for (DISTILSERVE_DTYPE, or the model's manifest)")
    with pytest.raises(BackendError, match="fp16 is not one this model runs in"):
        choose_dtype("fp16", "cuda", ("fp32", "bf16"))
    with pytest.raises(BackendError, match="unknown dtype"):
        choose_dtype("fp8", "cuda", ("fp32",))


@pytest.mark.parametrize("device", ["cpu", "auto", "cuda", "cuda:1"])
def test_known_devices(device):
    assert check_device(device) == device


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cpu:0", ""])
def test_unknown_devices_are_refused(device):
    with pytest.raises(BackendError, match="unknown device"):
        check_device(device)


@pytest.fixture(scope="module")
def exported(exports, tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("runtime")
    out = {}
    for fmt in ("torch", "torchscript", "onnx"):
        out[fmt] = root / fmt
        exports(tiny_checkpoints["minialbert", "embed"], out[fmt], fmt)
    return out


def _inputs(rows: int = 3, tokens: int = 12):
    g = np.random.default_rng(0)
    ids = g.integers(1000, 30000, (rows, tokens), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _cosines(a, b):
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return (a * b).sum(-1)


def _check_dtypes(exported, fmt, device):
    inputs = _inputs()
    manifest = Manifest.read(exported[fmt])
    ref = open_backend(fmt, exported[fmt], manifest.artifact, device=device).run(inputs)
    for dtype in ("fp16", "bf16"):
        backend = open_backend(fmt, exported[fmt], manifest.artifact, device=device,
                               dtype=dtype)
        assert backend.dtype == dtype
        got = backend.run(inputs)
        assert got.dtype == np.float32 and got.shape == ref.shape
        assert _cosines(ref, got).min() >= 0.999
        assert not np.array_equal(ref, got)  # really computed in the half dtype


@pytest.mark.parametrize("fmt", ["torch", "torchscript"])
def test_torch_backends_run_in_half_precision_on_the_cpu(exported, fmt):
    _check_dtypes(exported, fmt, "cpu")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("fmt", ["torch", "torchscript"])
def test_torch_backends_run_in_half_precision_on_cuda(exported, fmt):
    _check_dtypes(exported, fmt, "cuda")
    backend = open_backend(fmt, exported[fmt], "model.ts" if fmt == "torchscript" else None,
                           device="auto", dtype="auto")
    assert backend.device.startswith("cuda") and backend.dtype == "fp16"


def test_onnx_artifacts_compute_in_fp32(exported):
    backend = open_backend("onnx", exported["onnx"], "model.onnx", dtype="auto")
    assert (backend.device, backend.dtype) == ("cpu", "fp32")
    with pytest.raises(BackendError, match=r"fp16 is not one this model runs in \(fp32\): "
                       "ONNX Runtime runs the graph as exported, in fp32; export with "
                       "--format torchscript or torch to run in fp16 or bf16, as its family allows"):
        open_backend("onnx", exported["onnx"], "model.onnx", dtype="fp16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
@pytest.mark.parametrize("fmt", ["torch", "torchscript", "onnx"])
def test_cuda_without_a_gpu_is_a_clear_error(exported, fmt):
    artifact = {"torch": None, "torchscript": "model.ts", "onnx": "model.onnx"}[fmt]
    with pytest.raises(BackendError, match="no GPU is visible|no CUDA execution provider"):
        open_backend(fmt, exported[fmt], artifact, device="cuda")
    assert open_backend(fmt, exported[fmt], artifact, device="auto").device == "cpu"


def test_a_checkpoint_folder_is_traced_at_load_and_computes_what_the_onnx_model_does(exported):
    """What an ONNX model runs on a GPU without onnxruntime-gpu: its folder's checkpoint,
    traced by the TorchScript backend (here on the CPU, in fp32 and bf16)."""
    inputs = _inputs()
    onnx = open_backend("onnx", exported["onnx"], "model.onnx")
    assert onnx.batch_width(9) == 9  # runs a batch at its longest input's length
    ref = onnx.run(inputs)
    traced = TorchScriptBackend(exported["onnx"] / "checkpoint")
    assert np.allclose(traced.run(inputs), ref, atol=1e-4)
    half = TorchScriptBackend(exported["onnx"] / "checkpoint", dtype="bf16")
    assert half.dtype == "bf16" and _cosines(ref, half.run(inputs)).min() >= 0.999


def test_a_traced_checkpoint_runs_fused_on_the_cpu_one_frozen_copy_per_rounded_shape(
        tiny_checkpoints):
    """oneDNN Graph's fusion compiles a graph per input shape: batches are rounded up to a
    few shapes, each run by a copy of its own, the padding cut from the outputs [B, T, L]."""
    backend = TorchScriptBackend(Path(tiny_checkpoints["bert", "ner"]), dtype="bf16")
    fused = backend.forward
    assert isinstance(fused, FusedOnTheCpu)
    for rows, tokens in ((3, 12), (4, 16), (2, 9), (5, 11)):
        inputs = _inputs(rows, tokens)
        got = backend.run(inputs)
        with torch.inference_mode():
            plain = fused.plain(*(torch.from_numpy(inputs[k]) for k in INPUT_NAMES)).float()
        assert got.shape == tuple(plain.shape) == (rows, tokens, 7)  # B-/I- of 3 kinds, O
        keep = inputs["attention_mask"].astype(bool)  # the padding's own outputs are not used
        assert _cosines(got[keep], plain.numpy()[keep]).min() >= 0.999
    assert list(fused.fused) == [(4, 16), (2, 16), (8, 16)]
    assert [backend.batch_width(n) for n in (9, 16, 17)] == [16, 16, 32]  # for the batcher
    assert not torch.jit.onednn_fusion_enabled()  # on for its runs alone
    # past the budget for the weights' compiled copies, a shape runs unfused
    unfused = FusedOnTheCpu(fused.module, 128, weight_bytes=2, budget=1)
    assert torch.equal(unfused(*(torch.ones(2, 5, dtype=torch.long),) * 3),
                       fused.plain(*(torch.ones(2, 5, dtype=torch.long),) * 3))
    assert unfused.fused == {}


def test_fused_shapes_round_rows_and_tokens_up_within_the_models_length():
    fused = FusedOnTheCpu.__new__(FusedOnTheCpu)
    fused.max_length = 40
    assert [fused.shape(rows, 16)[0] for rows in (1, 2, 3, 5, 8, 9, 17, 64)] == \
        [1, 2, 4, 8, 8, 16, 24, 64]
    assert [fused.shape(1, tokens)[1] for tokens in (1, 16, 17, 33, 40)] == \
        [16, 16, 32, 40, 40]


def test_a_fill_mask_models_checkpoint_gives_its_artifacts_token_vectors(tmp_path):
    """Where a fill-mask model's checkpoint stands in for its artifact (the torch format; a
    TorchScript artifact traced again in a half dtype; an ONNX model on a GPU without
    onnxruntime-gpu), it is told its task: a masked-language checkpoint loaded without it
    is an embedding model, and gave pooled [B, E] vectors where [B, T, E] are served."""
    from distilserve.models.io import checkpoint

    source = checkpoint.save(checkpoint.new("bert", "tiny", "fill-mask"), tmp_path / "mlm")
    for fmt in ("onnx", "torchscript", "torch"):  # the torch format's parity check failed
        export.export(source, tmp_path / fmt, fmt, task="fill-mask")
    inputs = _inputs()
    ref = open_backend("onnx", tmp_path / "onnx", "model.onnx").run(inputs)  # [B, T, E]
    assert ref.shape == (3, 12, 32)
    stand_ins = {
        "torch": open_backend("torch", tmp_path / "torch", None, task="fill-mask"),
        "checkpoint traced": TorchScriptBackend(tmp_path / "onnx" / "checkpoint",
                                                task="fill-mask"),
        "traced again in bf16": open_backend("torchscript", tmp_path / "torchscript",
                                             "model.ts", dtype="bf16", task="fill-mask")}
    for name, backend in stand_ins.items():
        got = backend.run(inputs)
        assert got.shape == ref.shape, name
        assert _cosines(ref.reshape(-1, 32), got.reshape(-1, 32)).min() >= 0.99, name
    assert TorchScriptBackend(tmp_path / "onnx" / "checkpoint").run(inputs).shape == (3, 32)


NO_GPU = pytest.mark.skipif(torch.cuda.is_available() or has_cuda_provider(),
                            reason="a GPU is visible")


@NO_GPU
def test_the_service_runs_onnx_on_the_cpu_where_there_is_no_gpu(exported):
    backend = open_backend("onnx", exported["onnx"], "model.onnx", device="auto",
                           checkpoint_instead=True)
    assert (backend.name, backend.device, backend.dtype) == ("onnx", "cpu", "fp32")


@NO_GPU
def test_onnx_asked_for_a_gpu_goes_to_its_checkpoint_which_says_there_is_none(exported):
    """cuda, an ONNX model, an onnxruntime without the CUDA provider: the service runs the
    checkpoint there instead, so the error is the torch backends' one-line one."""
    with pytest.raises(BackendError, match="^device cuda asked for, but no GPU is visible"):
        open_backend("onnx", exported["onnx"], "model.onnx", device="cuda",
                     checkpoint_instead=True)


@NO_GPU
def test_auto_keeps_onnx_on_the_cpu_when_the_checkpoint_cannot_run_on_the_gpu(
        exported, exports, tmp_path, monkeypatch, caplog):
    folder = tmp_path / "m"
    exports.copy(exported["onnx"], folder)
    (folder / "checkpoint" / "model.safetensors").unlink()
    # a GPU as far as the choice can tell; the checkpoint's backend is placed on the CPU
    monkeypatch.setattr(selection, "GPU_DEVICE_FILES", (str(tmp_path),))  # a driver's, there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch_device, "resolve_device", lambda device: torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger="distilserve"):
        backend = open_backend("onnx", folder, "model.onnx", device="auto",
                               checkpoint_instead=True)
    assert (backend.name, backend.device) == ("onnx", "cpu")
    assert "m: ONNX Runtime on the CPU in fp32, not on the GPU: this onnxruntime has no CUDA " \
           "execution provider" in caplog.text
    assert "no model.safetensors or pytorch_model.bin" in caplog.text
    with pytest.raises(BackendError, match="^device cuda: this onnxruntime has no CUDA "
                       ".* the model's checkpoint, which would run there instead, did not: "
                       "CheckpointError: .*no model.safetensors"):
        open_backend("onnx", folder, "model.onnx", device="cuda", checkpoint_instead=True)


@NO_GPU
def test_auto_asks_torch_for_a_gpu_only_where_a_gpu_driver_is(exported, tmp_path, monkeypatch):
    """Without a driver's device files there is no GPU for torch to find, and torch (a
    second or more to import, ~150 MB) is not asked: an ONNX model on auto stays on the CPU
    without its checkpoint being tried."""
    monkeypatch.setattr(selection, "GPU_DEVICE_FILES", (str(tmp_path / "nvidiactl"),))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # would be asked: a GPU
    tried = []
    monkeypatch.setattr(selection, "_checkpoint_instead",
                        lambda *args: tried.append(args) or (None, "not run"))
    backend = open_backend("onnx", exported["onnx"], "model.onnx", device="auto",
                           checkpoint_instead=True)
    assert (backend.name, backend.device, tried) == ("onnx", "cpu", [])
    (tmp_path / "nvidiactl").touch()  # a driver: torch is asked, and says a GPU
    open_backend("onnx", exported["onnx"], "model.onnx", device="auto", checkpoint_instead=True)
    assert len(tried) == 1


@pytest.mark.gpu
@CUDA
def test_the_service_runs_an_onnx_model_on_the_gpu_without_onnxruntime_gpu(exported):
    if has_cuda_provider():
        pytest.skip("onnxruntime-gpu is installed: ONNX Runtime itself runs on the GPU")
    inputs = _inputs()
    ref = open_backend("onnx", exported["onnx"], "model.onnx").run(inputs)
    backend = open_backend("onnx", exported["onnx"], "model.onnx", device="auto",
                           dtype="auto", checkpoint_instead=True)
    assert (backend.name, backend.device, backend.dtype) == ("torchscript", "cuda:0", "fp16")
    assert _cosines(ref, backend.run(inputs)).min() >= 0.999


def test_export_records_how_each_dtype_compares_with_fp32(exported):
    import json

    dtypes = json.loads((exported["torch"] / "manifest.json").read_text())["dtypes"]
    assert set(dtypes) == {"fp32", "fp16", "bf16"}
    for name in ("fp16", "bf16"):
        assert dtypes[name]["passed"] and 0.999 <= dtypes[name]["min_cosine"] <= 1.0 + 1e-6
        assert "0.999" in dtypes[name]["tolerance"]


@pytest.mark.parametrize("family", ["minialbert", "falbert", "cmow"])
def test_traced_graphs_keep_no_device_so_they_run_on_a_gpu(family):
    """A traced graph keeps every device it was given as a constant: torch.arange(...,
    device=x.device) traced on the CPU would run on the CPU on a GPU machine too."""
    from distilserve.models.io import checkpoint

    for task in ("embed", "classify", "ner"):
        model = checkpoint.new(family, "tiny", task).model
        traced = torch.jit.trace(model, export.example_inputs(), check_trace=False)
        assert 'value="cpu"' not in str(traced.inlined_graph), (family, task)


@pytest.mark.parametrize(("device", "dtype", "tolerance"), [
    ("cpu", "fp32", 1e-5), ("cpu", "fp16", 2e-2), ("cpu", "bf16", 1e-1),
    pytest.param("cuda", "fp32", 1e-3, marks=[pytest.mark.gpu, CUDA]),  # (TF32 allowed)
    pytest.param("cuda", "fp16", 2e-2, marks=[pytest.mark.gpu, CUDA])])
def test_linear_on_a_device_gives_the_hosts_product_as_float32(device, dtype, tolerance):
    """A fill-mask decoder's product where its model runs: [N, E] float32 in, [N, V]
    float32 out, the weights placed once; equal to numpy's within the dtype's precision."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((50, 16)).astype(np.float32)  # [V, E]
    bias = rng.standard_normal(50).astype(np.float32)  # [V]
    product = torch_device.linear(weight, bias, device, dtype)
    for n in (1, 7):  # one mask, several
        x = rng.standard_normal((n, 16)).astype(np.float32)
        got = product(x)
        assert got.dtype == np.float32 and got.shape == (n, 50)
        expected = x @ weight.T + bias
        assert np.abs(got - expected).max() <= tolerance * np.abs(expected).max()


AMD_ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
GRAVITON3 = "Features\t: fp asimd sve bf16 i8mm\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\nbugs\t\t: bf16\n"


def test_bf16_matrix_units_are_read_from_the_processors_features():
    assert matrix_units.bf16_units_in(AMD_ZEN4) == "AVX-512 BF16 (avx512_bf16)"
    assert matrix_units.bf16_units_in(SAPPHIRE_RAPIDS) == "AMX (amx_bf16)"
    assert matrix_units.bf16_units_in(GRAVITON3) == "Arm BF16 (bf16)"
    assert matrix_units.bf16_units_in(SKYLAKE) is None  # (a word on another line is not one)
    assert matrix_units.bf16_units_in("") is None


@pytest.fixture
def units(monkeypatch):
    """Sets what the processor is said to have: a /proc/cpuinfo text."""
    return lambda cpuinfo: monkeypatch.setattr(
        base, "bf16_units", lambda: matrix_units.bf16_units_in(cpuinfo))


def test_auto_dtype_on_the_cpu_is_bf16_where_it_has_bf16_matrix_units_and_the_model_allows(units):
    units(SAPPHIRE_RAPIDS)
    assert choose_dtype("auto", "cpu", ("fp32", "fp16", "bf16")) == (
        "bf16", "auto: bf16, on this CPU's AMX (amx_bf16)")
    dtype, why = choose_dtype("auto", "cpu", ("fp32", "fp16"))  # bf16 failed its parity
    assert dtype == "fp32" and why.startswith("auto: fp32; this CPU's AMX (amx_bf16) would "
                                              "run bf16, which the model does not (fp32, fp16")
    assert choose_dtype("auto", "cpu", ("fp32", "bf16"), cpu_bf16=False) == (  # CMOW
        "fp32", "auto: fp32; this CPU's AMX (amx_bf16) would run bf16, which is slower for "
        "this family (not large matrix products)")
    units(SKYLAKE)
    assert choose_dtype("auto", "cpu", ("fp32", "fp16", "bf16")) == (
        "fp32", "auto: fp32, this CPU has no bf16 matrix units (AMX, AVX-512 BF16 or Arm BF16)")


def test_the_service_runs_an_onnx_model_from_its_checkpoint_in_bf16_on_a_cpu_with_the_units(
        exported, units, caplog):
    inputs = _inputs()
    ref = open_backend("onnx", exported["onnx"], "model.onnx").run(inputs)
    units(AMD_ZEN4)
    with caplog.at_level(logging.INFO, logger="distilserve"):
        backend = open_backend("onnx", exported["onnx"], "model.onnx", device="auto",
                               dtype="auto", checkpoint_instead=True)
    assert (backend.name, backend.device, backend.dtype) == ("torchscript", "cpu", "bf16")
    assert backend.dtype_reason == "auto: bf16, on this CPU's AVX-512 BF16 (avx512_bf16)"
    assert "onnx: an ONNX model, run on cpu in bf16 from its checkpoint, traced with " \
           "TorchScript, as ONNX Runtime runs the graph as exported, in fp32" in caplog.text
    got = backend.run(inputs)
    assert _cosines(ref, got).min() >= 0.999 and not np.array_equal(ref, got)
    # an int8 artifact is served as exported; so is any ONNX model outside the service
    for kwargs in ({"checkpoint_instead": True, "quantized": True}, {}):
        backend = open_backend("onnx", exported["onnx"], "model.onnx", dtype="auto", **kwargs)
        assert (backend.name, backend.dtype) == ("onnx", "fp32"), kwargs
        assert backend.dtype_reason == "ONNX Runtime runs the graph as exported, in fp32"
    units(SKYLAKE)
    backend = open_backend("onnx", exported["onnx"], "model.onnx", dtype="auto",
                           checkpoint_instead=True)
    assert (backend.name, backend.dtype) == ("onnx", "fp32")
    # asked for by name, bf16 is had from the checkpoint whatever the processor
    backend = open_backend("onnx", exported["onnx"], "model.onnx", dtype="bf16",
                           checkpoint_instead=True)
    assert (backend.name, backend.dtype) == ("torchscript", "bf16")


def test_auto_keeps_onnx_in_fp32_where_the_checkpoint_cannot_run_in_bf16(
        exported, exports, tmp_path, units, monkeypatch, caplog):
    """No weights in the checkpoint, or no torch to run it (the CPU-only install serves
    ONNX without it): ONNX Runtime in fp32, with why; asked for by name, an error."""
    folder = tmp_path / "m"
    exports.copy(exported["onnx"], folder)
    units(AMD_ZEN4)
    monkeypatch.setitem(sys.modules, "distilserve.models.runtime.torchscript", None)  # no torch
    with caplog.at_level(logging.WARNING, logger="distilserve"):
        backend = open_backend("onnx", folder, "model.onnx", dtype="auto",
                               checkpoint_instead=True)
    assert (backend.name, backend.dtype) == ("onnx", "fp32")
    assert backend.dtype_reason == ("ONNX Runtime runs the graph as exported, in fp32: its "
                                    "checkpoint, run instead, did not (ModuleNotFoundError; "
                                    "logged)")
    assert "m: ONNX Runtime on the CPU in fp32, not in bf16: ONNX Runtime runs the graph as " \
           "exported, in fp32, and the model's checkpoint did not run so: ModuleNotFound" \
        in caplog.text
    monkeypatch.delitem(sys.modules, "distilserve.models.runtime.torchscript")
    (folder / "checkpoint" / "model.safetensors").unlink()
    assert open_backend("onnx", folder, "model.onnx", dtype="auto",
                        checkpoint_instead=True).name == "onnx"
    with pytest.raises(BackendError, match="^dtype bf16: ONNX Runtime runs the graph as "
                       "exported, in fp32, and the model's checkpoint, which would run so "
                       "instead, did not: CheckpointError: .*no model.safetensors"):
        open_backend("onnx", folder, "model.onnx", dtype="bf16", checkpoint_instead=True)


@pytest.fixture(scope="module")
def recursive_exports(exports, tiny_checkpoints, tmp_path_factory):
    """(family, format, loop) -> (its model, its backend), a tiny embedding model of each
    recursive family in every format and loop (the checkpoint, format torch: its own)."""
    from distilserve.models.io import checkpoint

    root, out = tmp_path_factory.mktemp("depths"), {}
    for family in ("minialbert", "falbert"):
        folder = tiny_checkpoints[family, "embed"]
        model = checkpoint.load(folder).model.eval()
        for fmt, loop in (("onnx", "keep"), ("torchscript", "keep"), ("torch", "unroll"),
                          ("onnx", "unroll"), ("torchscript", "unroll")):
            made = exports(folder, root / f"{family}-{fmt}-{loop}", fmt, loop)
            out[family, fmt, loop] = model, open_backend(
                fmt, root / f"{family}-{fmt}-{loop}", made.artifact,
                num_iterations=made.num_iterations)
    return out


@pytest.mark.parametrize("family", ["minialbert", "falbert"])
@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "torch"])
def test_a_kept_loop_runs_at_every_depth_as_the_model_does(recursive_exports, family, fmt):
    """MiniALBERT's iteration i with its adapter i, F-ALBERT's with its FFN cut i: the
    depth a batch asks for (num_iterations) gives what PyTorch gives at that depth."""
    model, backend = recursive_exports[family, fmt, "unroll" if fmt == "torch" else "keep"]
    assert backend.depth == model.num_iterations > 1
    ids = torch.randint(1000, 3000, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    arrays = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
              "token_type_ids": np.zeros_like(ids.numpy())}
    outputs = []
    for depth in range(1, backend.depth + 1):
        with torch.no_grad():
            expected = model.forward_iterations(ids, mask, torch.zeros_like(ids), depth).numpy()
        got = backend.run({**arrays, "num_iterations": np.array(depth, dtype=np.int64)})
        assert np.abs(got - expected).max() <= 1e-4, depth
        outputs.append(got)
    assert np.abs(backend.run(arrays) - outputs[-1]).max() <= 1e-6  # its own: the last
    assert np.abs(outputs[0] - outputs[-1]).max() > 1e-3  # the depths differ


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_an_unrolled_loop_has_a_fixed_depth(recursive_exports, fmt):
    assert recursive_exports["minialbert", fmt, "unroll"][1].depth is None


def test_a_kept_loop_run_from_its_checkpoint_in_bf16_keeps_its_depth(tiny_checkpoints, tmp_path):
    """An ONNX model with its loop kept, served in bf16 (auto on a CPU with bf16 units) from
    its checkpoint: scripted, not traced, so that a request may still choose its depth."""
    from distilserve.models.io import checkpoint

    folder = tiny_checkpoints["falbert", "embed"]
    made = export.export(folder, tmp_path / "kept", "onnx", "keep")
    backend = open_backend("onnx", tmp_path / "kept", made.artifact, 0, made.num_iterations,
                           "cpu", "bf16", made.allowed_dtypes, checkpoint_instead=True,
                           keep_loop=True)
    assert (backend.name, backend.dtype, backend.depth) == ("torchscript", "bf16", 4)
    model = checkpoint.load(folder).model.eval()
    ids = torch.randint(1000, 3000, (2, 7), generator=torch.Generator().manual_seed(2))
    arrays = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy()),
              "token_type_ids": np.zeros_like(ids.numpy())}
    for depth in (1, 4):
        with torch.no_grad():
            expected = model.forward_iterations(ids, torch.ones_like(ids),
                                                torch.zeros_like(ids), depth).numpy()
        got = backend.run({**arrays, "num_iterations": np.array(depth, dtype=np.int64)})
        assert np.abs(got - expected).max() <= 0.05 * np.abs(expected).max(), depth
    traced = open_backend("onnx", tmp_path / "kept", made.artifact, 0, made.num_iterations,
                          "cpu", "bf16", made.allowed_dtypes, checkpoint_instead=True)
    assert traced.depth is None  # (an unrolled export's checkpoint: traced)
