"""The engine: where a model runs (device, dtype, batch limits), what it reports, and how it
drives an asynchronous (GPU) backend."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from distilserve.models import export
from distilserve.models.io import checkpoint
from distilserve.models.io.manifest import Manifest
from distilserve.server.core.batching import pad
from distilserve.server.core.runner import open_decoder, read_decoder
from distilserve.server.core.tokenisation import WholeIds
from distilserve.server.engine import (
    InputTooLong,
    ModelLoadError,
    NotFinite,
    load_engine,
    on_own_thread,
)
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings
from tests.conftest import FAMILIES, TASKS, wait_for


@pytest.fixture(scope="module")
def torch_model(exports, tiny_checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("engine") / "falbert"
    exports(tiny_checkpoints["falbert", "embed"], folder, "torch", check=False)
    return folder


@pytest.fixture(scope="module")
def onnx_model(exports, tiny_checkpoints, tmp_path_factory):
    """A tiny BERT embedding model (32 wide, 128 positions) exported to ONNX."""
    folder = tmp_path_factory.mktemp("engine") / "bert"
    exports(tiny_checkpoints["bert", "embed"], folder, "onnx", check=False)
    return folder


def test_allowed_dtypes_are_the_familys_less_those_that_failed_parity():
    def allowed(family, dtypes=None):
        return Manifest(task="embed", family=family, backend="onnx", max_length=8,
                        dtypes=dtypes).allowed_dtypes

    assert allowed("bert") == ["fp32", "fp16", "bf16"]
    assert allowed("cmow") == ["fp32", "bf16"]
    failed = {"fp32": {"passed": True}, "fp16": {"passed": False}, "bf16": {"passed": True}}
    assert allowed("bert", failed) == ["fp32", "bf16"]


def _run(engine, texts):
    async def go():
        await engine.start(warmup=False)
        try:
            return await engine.infer(texts, "right")
        finally:
            await engine.stop()
    return asyncio.run(go())


def test_an_input_whose_outputs_are_not_finite_fails_alone(onnx_model, monkeypatch):
    """CMOW's products pass float32's range on long inputs (a fresh cmow-hybrid-bidi: 1e23
    at 400 words, infinite at 422 tokens of a repeated phrase): JSON carried the
    infinities as nulls, and normalising turned them into NaN. Now such an input fails,
    named, and the other inputs of its batch are answered."""
    from distilserve.models.runtime.onnx import OnnxBackend

    real = OnnxBackend.run

    def overflowing(self, arrays):  # past 8 tokens, as CMOW past some length
        out = real(self, arrays)
        out[arrays["attention_mask"].sum(1) > 8] = np.inf
        return out

    monkeypatch.setattr(OnnxBackend, "run", overflowing)
    engine = load_engine("m", onnx_model, Settings(), Metrics())
    long = "a sentence that runs past eight tokens"

    async def go():
        await engine.start(warmup=False)
        try:  # both in one batch where the model's thread takes them together
            return await asyncio.gather(engine.infer(["short"], "right"),
                                        engine.infer(["short", long], "right"),
                                        return_exceptions=True)
        finally:
            await engine.stop()

    short, failed = asyncio.run(go())
    assert np.isfinite(short.outputs[0]).all()
    assert isinstance(failed, NotFinite)
    assert str(failed).startswith("input 1: the model's outputs for its 10 tokens are not "
                                  "finite")

    zebra = engine.text.tokenizers[None].token_to_id("zebra")

    def zebra_overflows(self, arrays):
        out = real(self, arrays)
        out[(arrays["input_ids"] == zebra).any(1)] = np.inf
        return out

    monkeypatch.setattr(OnnxBackend, "run", zebra_overflows)
    engine = load_engine("m", onnx_model, Settings(), Metrics())

    async def windowed():  # NER's stride: the first input runs as five windows
        await engine.start(warmup=False)
        try:
            await engine.infer(["a b c d e f g h i j k l m n o p", "a zebra"], None, (6, 1))
        finally:
            await engine.stop()

    with pytest.raises(NotFinite, match="^input 1: "):  # (it said input 5, its window)
        asyncio.run(windowed())


def test_a_model_runs_in_the_dtype_asked_for(torch_model):
    texts = ["The cat sat on the mat.", "A longer sentence about something else entirely."]
    fp32 = load_engine("m", torch_model, Settings(), Metrics())
    bf16 = load_engine("m", torch_model, Settings(dtype="bf16"), Metrics())
    assert (fp32.describe()["device"], fp32.describe()["dtype"]) == ("cpu", "fp32")
    assert bf16.describe()["dtype"] == "bf16"
    a, b = np.stack(_run(fp32, texts).outputs), np.stack(_run(bf16, texts).outputs)
    assert a.dtype == b.dtype == np.float32 and not np.array_equal(a, b)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cos.min() >= 0.999


def test_a_dtype_that_failed_the_exports_parity_check_is_refused(torch_model, exports, tmp_path):
    folder = tmp_path / "model"
    exports.copy(torch_model, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["dtypes"] = {"fp32": {"passed": True}, "fp16": {"passed": False}}  # as recorded
    manifest["dtype"] = "fp16"  # the model's own choice, over the service's
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=r"model.*fp16 is not one this model runs in"):
        load_engine("m", folder, Settings(), Metrics())


@pytest.mark.parametrize("change,words", [
    ({"max_length": 4096}, r"an input of its max_length \(4096 tokens, more than the model "
                           r"takes\?\) failed: "),  # past its 128 positions
    # [CLS] and [SEP] alone: before, each text was served as [CLS] [SEP], the same vector
    ({"max_length": 2}, r"its max_length, 2, leaves no token of text beside the special "
                        r"tokens of an input: re-export it with --max-length 3 or more"),
    ({"dimensions": 7}, r"its artifact gives outputs of shape \[1, 32\] for one input of 128 tokens, "
                        r"where its manifest \(task embed, dimensions 7\) says \[1, 7\]"),
    ({"task": "classify", "labels": ["a", "b"], "pooling": None, "dimensions": None},
     r"its artifact gives outputs of shape \[1, 32\] .* \(task classify, labels 2\) says \[1, 2\]"),
    ({"task": "ner", "labels": ["O"], "pooling": None, "dimensions": None},
     r"its artifact gives outputs of shape \[1, 32\] .* \(task ner, labels 1\) says \[1, 128, 1\]"),
])
def test_a_manifest_that_says_other_than_its_artifact_does_is_refused(onnx_model, exports,
                                                                       tmp_path, change, words):
    """Edited by hand, or beside another model's artifact: refused at load, naming the
    folder, rather than failing the requests (an IndexError, a 500) it cannot serve."""
    folder = tmp_path / "model"
    exports.copy(onnx_model, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, **change}))
    with pytest.raises(ModelLoadError, match=f"^{folder}: {words}"):
        load_engine("m", folder, Settings(), Metrics())


def test_a_broken_tokenizer_json_is_named_and_a_missing_one_made_by_transformers(onnx_model,
                                                                                 exports, tmp_path):
    """The manifest's ``tokenizer`` has the service read checkpoint/tokenizer.json alone:
    where that file does not read, the error names it; where it is gone, transformers makes
    the tokenizer from vocab.txt, as it did before the manifest said anything."""
    folder = tmp_path / "model"
    exports.copy(onnx_model, folder)
    assert Manifest.read(folder).tokenizer is not None
    file = folder / "checkpoint" / "tokenizer.json"
    whole = load_engine("m", folder, Settings(), Metrics()).text.tokens(["Hello, world"], True)
    file.write_text('{"version": "1.0", "trunc')
    with pytest.raises(ModelLoadError, match=f"^{file}: "):
        load_engine("m", folder, Settings(), Metrics())
    file.unlink()
    assert load_engine("m", folder, Settings(), Metrics()).text.tokens(["Hello, world"], True) == whole


def test_a_model_folder_without_its_checkpoint_names_it_and_never_asks_the_hub(
        onnx_model, exports, tmp_path, monkeypatch):
    """Read from where it is, a folder "m" gives "m/checkpoint", which reads as a Hub
    repository's name: its missing checkpoint is said so before transformers is asked
    (which would look for it on the Hub)."""
    monkeypatch.chdir(tmp_path)
    exports.copy(onnx_model, tmp_path / "m")
    shutil.rmtree(tmp_path / "m" / "checkpoint")
    with pytest.raises(ModelLoadError, match=r"^m/checkpoint: missing \(a model folder keeps"):
        load_engine("m", Path("m"), Settings(), Metrics())
    with pytest.raises(checkpoint.CheckpointError, match="^m/checkpoint: no such folder"):
        checkpoint.fast_tokenizer("m/checkpoint")


def test_a_torchscript_file_that_does_not_load_is_named(exports, tiny_checkpoints, tmp_path):
    folder = tmp_path / "model"
    exports(tiny_checkpoints["bert", "embed"], folder, "torchscript", check=False)
    artifact = folder / "model.ts"
    torn = artifact.read_bytes()[:1000]
    artifact.unlink()  # (a link to the run's one export: replaced, not written into)
    artifact.write_bytes(torn)
    with pytest.raises(ModelLoadError, match=f"^{folder}: model.ts does not load as "
                       "TorchScript: PytorchStreamReader failed reading zip archive[^.]*$"):
        load_engine("m", folder, Settings(dtype="fp32"), Metrics())


def test_a_kept_loops_manifest_that_says_another_depth_is_refused(torch_model, exports, tmp_path):
    folder = tmp_path / "model"
    exports.copy(torch_model, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    trained = manifest["num_iterations"]
    (folder / "manifest.json").write_text(json.dumps({**manifest, "num_iterations": trained + 4}))
    with pytest.raises(ModelLoadError, match=f"^{folder}: its manifest says num_iterations "
                       f"{trained + 4}, where its model runs {trained}: re-export it$"):
        load_engine("m", folder, Settings(), Metrics())


def test_an_int8_model_says_so(tiny_checkpoints, tmp_path):
    folder = tmp_path / "int8"
    export.export(tiny_checkpoints["bert", "embed"], folder, "onnx", quantize="int8")
    assert load_engine("m", folder, Settings(), Metrics()).describe()["quantization"] == "int8"
    export.export(tiny_checkpoints["bert", "embed"], folder, "onnx", force=True)
    assert "quantization" not in load_engine("m", folder, Settings(), Metrics()).describe()


def test_a_fill_mask_model_loads_its_decoder_and_names_a_broken_one(exports, tmp_path):
    from distilserve.models.io.manifest import DECODER

    source = checkpoint.save(checkpoint.new("bert", "tiny", "fill-mask"), tmp_path / "mlm")
    folder = tmp_path / "model"
    manifest = exports(source, folder, "onnx", task="fill-mask")
    assert manifest.task == "fill-mask" and DECODER in manifest.files
    engine = load_engine("m", folder, Settings(), Metrics())
    weight, bias = read_decoder(folder)
    assert weight.shape == (engine.text.vocab_size, 32) and bias.shape == (engine.text.vocab_size,)
    vectors = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    np.testing.assert_allclose(engine.runner.decoder(vectors), vectors @ weight.T + bias, rtol=1e-6)
    assert engine.describe()["mask_token"] == "[MASK]"
    assert engine.text.target_ids(["paris", "paris", "[MASK]"]) == [3000, engine.text.mask_id]
    (folder / DECODER).unlink()  # linked to the run's export (conftest.Exports)
    (folder / DECODER).write_bytes(b"not safetensors")
    with pytest.raises(ModelLoadError, match=r"decoder\.safetensors: .*a fill-mask model's"):
        load_engine("m", folder, Settings(), Metrics())


def test_a_fill_mask_decoder_runs_where_its_model_runs_on_a_gpu(exports, tmp_path, monkeypatch):
    """On a GPU the decoder is placed on the model's device in its dtype (checked on CUDA by
    tests/models/test_runtime.py and tests/e2e/test_gpu.py); elsewhere it runs on the host."""
    import torch

    from distilserve.models.runtime import torch_device

    source = checkpoint.save(checkpoint.new("bert", "tiny", "fill-mask"), tmp_path / "mlm")
    folder = tmp_path / "model"
    exports(source, folder, "onnx", task="fill-mask")
    placed = []
    monkeypatch.setattr(torch_device, "linear", lambda w, b, device, dtype: placed.append(
        (w.shape, device, dtype)) or "on the GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = type("Backend", (), {"device": "cuda:1", "dtype": "fp16"})()
    assert open_decoder(folder, gpu) == "on the GPU" and placed == [((30522, 32), "cuda:1",
                                                                      "fp16")]
    host = type("Backend", (), {"device": "cpu", "dtype": "fp32"})()
    assert open_decoder(folder, host)(np.zeros((2, 32), np.float32)).shape == (2, 30522)
    assert len(placed) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu_names_the_model(torch_model):
    with pytest.raises(ModelLoadError, match=r"falbert: device cuda asked for, but no GPU"):
        load_engine("m", torch_model, Settings(device="cuda"), Metrics())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_an_onnx_model_runs_its_checkpoint_where_onnxruntime_cannot_use_the_gpu(
        tiny_checkpoints, tmp_path, monkeypatch, caplog, exports):
    """The service opts in (models/runtime's checkpoint_instead): here the 'GPU' is the CPU,
    made visible to the choice and given to the torch backend in its place."""
    from distilserve.models.runtime import selection, torch_device

    folder = tmp_path / "onnx"
    exports(tiny_checkpoints["bert", "embed"], folder, "onnx")
    texts = ["The cat sat on the mat.", "A longer sentence about something else entirely."]
    onnx = load_engine("m", folder, Settings(), Metrics())
    assert onnx.describe()["backend"] == "onnx"
    monkeypatch.setattr(selection, "GPU_DEVICE_FILES", (str(tmp_path),))  # a driver's, there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch_device, "resolve_device", lambda device: torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="distilserve"):
        traced = load_engine("m", folder, Settings(), Metrics())
    assert traced.describe()["backend"] == "torchscript"
    assert "onnx: an ONNX model, run on cpu in fp32 from its checkpoint, traced with " \
           "TorchScript, as this onnxruntime has no CUDA execution provider" in caplog.text
    a, b = np.stack(_run(onnx, texts).outputs), np.stack(_run(traced, texts).outputs)
    assert np.allclose(a, b, atol=1e-4)


def test_auto_serves_an_onnx_model_in_bf16_on_a_cpu_with_bf16_matrix_units(
        onnx_model, tiny_checkpoints, tmp_path, monkeypatch, caplog, exports):
    """Where the processor has bf16 matrix units, ``auto`` runs an ONNX model's checkpoint
    in bf16 (ONNX Runtime computes in fp32), says why in /v1/models and the log, and gives
    what fp32 gives within bf16's precision; where it has none, or for CMOW, ONNX Runtime
    as before."""
    from distilserve.models.runtime import base, matrix_units

    texts = ["The cat sat on the mat.", "A longer sentence about something else entirely."]
    fp32 = load_engine("m", onnx_model, Settings(dtype="fp32"), Metrics())
    assert fp32.describe()["dtype_reason"] == "ONNX Runtime runs the graph as exported, in fp32"
    monkeypatch.setattr(base, "bf16_units", lambda: matrix_units.bf16_units_in(
        "flags\t\t: avx512f amx_bf16 avx512_bf16"))
    with caplog.at_level(logging.INFO, logger="distilserve"):
        bf16 = load_engine("m", onnx_model, Settings(dtype="auto"), Metrics())
    described = bf16.describe()
    assert (described["backend"], described["dtype"]) == ("torchscript", "bf16")
    assert described["dtype_reason"] == "auto: bf16, on this CPU's AMX (amx_bf16)"
    assert "bert: an ONNX model, run on cpu in bf16 from its checkpoint" in caplog.text
    a, b = np.stack(_run(fp32, texts).outputs), np.stack(_run(bf16, texts).outputs)
    cosines = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cosines.min() >= 0.999 and not np.array_equal(a, b)
    cmow = tmp_path / "cmow"  # whose products of small matrices bf16 slows down
    exports(tiny_checkpoints["cmow", "embed"], cmow, "onnx")
    described = load_engine("m", cmow, Settings(dtype="auto"), Metrics()).describe()
    assert (described["backend"], described["dtype"]) == ("onnx", "fp32")
    monkeypatch.setattr(base, "bf16_units", lambda: None)
    plain = load_engine("m", onnx_model, Settings(dtype="auto"), Metrics()).describe()
    assert (plain["backend"], plain["dtype"]) == ("onnx", "fp32")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_familys_onnx_model_is_served_in_bf16_on_the_cpu(exports, family, tiny_checkpoints,
                                                               tmp_path):
    """Each family's ONNX export run in bf16 by the service (its checkpoint, traced), for
    each task: what fp32 gives, within bf16's precision; where the export's bf16 check
    failed (a tiny model's near-zero logits), a clear refusal at load."""
    texts = ["The cat sat on the mat.", "A longer sentence about something else entirely."]

    def rows(engine):  # one per text, or per token (NER: with its encoding)
        outputs = [o[0] if isinstance(o, tuple) else o for o in _run(engine, texts).outputs]
        return np.concatenate([o.reshape(-1, o.shape[-1]) for o in outputs])

    ran = []
    for task in TASKS:
        folder = tmp_path / task
        exports(tiny_checkpoints[family, task], folder, "onnx")
        if "bf16" not in Manifest.read(folder).allowed_dtypes:
            with pytest.raises(ModelLoadError, match="dtype bf16 is not one this model runs in"):
                load_engine("m", folder, Settings(dtype="bf16"), Metrics())
            continue
        bf16 = load_engine("m", folder, Settings(dtype="bf16"), Metrics())
        assert (bf16.runner.backend.name, bf16.runner.backend.dtype) == ("torchscript", "bf16")
        assert bf16.runner.batcher.width(9) == 16  # batches pad to its fused copies' lengths
        a, b = rows(load_engine("m", folder, Settings(dtype="fp32"), Metrics())), rows(bf16)
        cosines = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        assert cosines.min() >= 0.999, (family, task)
        ran.append(task)
    assert "embed" in ran


def test_cuda_graphs_on_by_default_change_nothing_on_the_cpu(torch_model, caplog):
    assert Settings().cuda_graph_tokens == 4096  # for a GPU: measured there (the docs: GPUs)
    with caplog.at_level(logging.INFO, logger="distilserve"):
        engine = load_engine("m", torch_model, Settings(), Metrics())
    assert engine.runner.backend.place.graphs is None and "cuda_graph_tokens" not in engine.describe()
    assert "CUDA graphs" not in caplog.text  # nothing to say where there is no GPU
    assert len(_run(engine, ["one", "two"]).outputs) == 2


def test_batch_limits_default_by_device():
    assert Settings(threads=2).batch_limits("cpu") == (32, 1024)  # 512 per thread
    assert Settings(threads=1).batch_limits("cpu") == (32, 512)
    assert Settings(threads=2).batch_limits("cpu", "bf16") == (64, 1024)  # matrix units
    assert Settings(max_batch_size=16).batch_limits("cpu", "bf16") == (16, 512 * Settings().model_threads())
    assert Settings().batch_limits("cuda:0") == (256, 65_536)
    assert Settings(max_batch_size=8, max_batch_tokens=100).batch_limits("cuda:0") == (8, 100)


def test_worker_processes_share_the_cores_out(monkeypatch):
    monkeypatch.setattr("distilserve.server.settings.available_cores", lambda: 16)
    assert Settings().model_threads() == 16
    assert Settings(workers=4).model_threads() == 4
    assert Settings(workers=32).model_threads() == 1
    assert Settings(workers=4, threads=8).model_threads() == 8


def test_settings_refuse_an_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        Settings(device="gpu")


def test_a_models_series_exist_from_its_start_and_count_its_batches(torch_model):
    metrics = Metrics()
    engine = load_engine("m", torch_model, Settings(), metrics)

    def value(name):
        return metrics.registry.get_sample_value(name, {"model": "m"})

    assert (value("distilserve_rejected_inputs_total"), value("distilserve_queue_depth"),
            value("distilserve_batch_size_count")) == (0, 0, 0)  # there before any traffic
    _run(engine, ["one", "two"])
    assert value("distilserve_batch_size_count") >= 1
    assert value("distilserve_batch_size_sum") == 2  # both inputs, in one batch or two
    assert value("distilserve_inference_seconds_count") == value("distilserve_batch_size_count")
    # inputs cut to max_length are counted: texts and token ids, cut at either end
    assert value("distilserve_truncated_inputs_total") == 0
    engine = load_engine("m", torch_model, Settings(), metrics)  # the same series
    long = "word " * (engine.max_length + 5)
    _run(engine, [long, "short", [7] * (engine.max_length + 5), [7, 8]])
    assert value("distilserve_truncated_inputs_total") == 2
    assert value("distilserve_queue_depth") == 0


def test_the_warm_up_is_not_counted(torch_model):
    """The model's batch series (and Triton's statistics of them) count the clients'
    inputs, not the warm-up's."""
    metrics = Metrics()
    engine = load_engine("m", torch_model, Settings(), metrics)

    async def go():
        await engine.start()  # two warm-up requests, a batch each
        warm = metrics.statistics(["m"])[0]
        try:
            await engine.infer(["one"], "right")
        finally:
            await engine.stop()
        return warm, metrics.statistics(["m"])[0]

    warm, served = asyncio.run(go())
    assert (warm["execution_count"], warm["inference_count"]) == (0, 0)
    assert (served["execution_count"], served["inference_count"]) == (1, 1)


def test_question_answering_runs_each_pair_as_its_windows(exports, tiny_checkpoints, tmp_path):

    folder = tmp_path / "squad"
    exports(checkpoint.save(checkpoint.new("bert", "tiny", "qa"), tmp_path / "ck"),
            folder, "onnx")
    engine = load_engine("squad", folder, Settings(), Metrics())
    pairs = [("Where?", "word " * 60), ("Who?", "Ada.")]

    async def go():
        await engine.start(warmup=False)
        try:
            return await engine.infer(pairs, None, (24, 4))
        finally:
            await engine.stop()

    result = asyncio.run(go())
    long, short = result.outputs  # each pair's windows: (logits [T, 2], encoding)
    expected = engine.text.windows(pairs[:1], 24, 4)[0]
    assert len(long) == len(expected) > 3 and len(short) == 1
    for (logits, encoding), window in zip(long, expected):
        assert encoding.ids == window.ids and logits.shape == (len(window.ids), 2)
    assert result.characters == sum(len(q) + len(c) for q, c in pairs)  # once each
    assert result.tokens == sum(len(w.ids) for w in expected) + len(short[0][1].ids)
    assert result.tokenize_s > 0  # the windows were made in it


def test_an_input_too_long_is_refused_before_it_is_queued(torch_model):
    engine = load_engine("m", torch_model, Settings(), Metrics())
    submitted = []
    submit = engine.runner.batcher.submit
    engine.runner.batcher.submit = lambda *args: submitted.append(args) or submit(*args)
    long = "word " * (engine.max_length + 10)

    async def go():
        await engine.start(warmup=False)
        try:
            with pytest.raises(InputTooLong, match=r"input 1 has \d+ tokens, more than the "
                               r"model's max_length \d+"):
                await engine.infer(["short", long], None)
            assert submitted == []  # nothing was queued, not even the short input
            fine = await engine.infer(["short", "also short"], None)
            assert len(fine.outputs) == 2 and submitted[0][2] is not None  # tokenised once
            cut = await engine.infer([long], "right")
            assert cut.tokens == engine.max_length
        finally:
            await engine.stop()

    asyncio.run(go())


def test_a_long_input_is_cut_at_its_end_or_its_start_as_asked(torch_model):
    engine = load_engine("m", torch_model, Settings(), Metrics())
    n = engine.max_length
    words = [f"w{i}" for i in range(n + 20)]
    plain = engine.text.tokenize([" ".join(words)], None)[0].ids  # [CLS] ... [SEP], untruncated
    assert len(plain) > n
    right, left = (engine.text.tokenize([" ".join(words)], t)[0] for t in ("right", "left"))
    assert right.ids == plain[: n - 1] + plain[-1:]  # the start kept
    assert left.ids == plain[:1] + plain[len(plain) - n + 1:]  # the end kept
    # the offsets are still the text's own: the last word is where it was
    assert left.offsets[-2][1] == len(" ".join(words))
    # token ids are cut alike, around the same special tokens
    ids = plain[1:-1]
    assert [engine.text.tokenize([ids], t)[0].ids for t in ("right", "left")] == [right.ids,
                                                                             left.ids]
    cut = [engine.text.tokenize([ids], t)[0].overflowing for t in ("right", "left")]
    assert cut == [ids[n - 2:], ids[:len(ids) - n + 2]]  # what each side cut off
    assert engine.text.tokenize([ids], None)[0].ids == plain
    # the whole input's ids (TEI's): given nothing, cut to max_length from the side asked
    whole = WholeIds(plain)
    assert engine.text.tokenize([whole], None)[0].ids == plain
    assert [engine.text.tokenize([whole], t)[0].ids for t in ("right", "left")] == [
        plain[:n], plain[len(plain) - n:]]
    # a pair: the longer text is cut, from the side asked
    pair = engine.text.tokenize([("first text", " ".join(words))], "left")[0]
    assert len(pair.ids) == n and pair.offsets[-2][1] == len(" ".join(words))


def test_a_text_cut_to_some_tokens_reads_as_those_tokens(onnx_model):
    """Cohere's max_tokens: a text cut at the characters where its tokens end tokenises
    as its first tokens, a word cut within it too (WordPiece's pieces); cut from its
    start, as its last tokens from the first that begins a word; never as more."""
    engine = load_engine("m", onnx_model, Settings(), Metrics())
    text = "Unbelievably, the tokenisation of hyphen-ated words works: naïve 東京 ligature"
    encoding = engine.text.tokenize([text], None)[0]
    tokens, words = encoding.ids[1:-1], encoding.word_ids[1:-1]  # its tokens of text
    n = len(tokens)
    assert len(set(words)) < n  # some words are in pieces
    for most in range(1, n + 1):
        (right, count), = engine.text.counted_cuts([text], most, "right")
        (left, _), = engine.text.counted_cuts([text], most, "left")
        assert count == n
        assert engine.text.tokenize([right], None)[0].ids[1:-1] == tokens[:most]
        start = next((k for k in range(n - most, n) if k == 0 or words[k] != words[k - 1]),
                     None)
        read = engine.text.tokenize([left], None)[0].ids[1:-1]
        assert len(read) <= most and text.endswith(left)
        if start is not None:  # else the last word's pieces, cut within it
            assert read == tokens[start:]
        assert text.startswith(right)
    assert engine.text.counted_cuts([text, "short"], 3, None) == [(text, n), ("short", 1)]


def test_a_pair_cut_to_some_tokens_reads_as_the_tokenizer_cuts_it(onnx_model):
    """vLLM's truncate_prompt_tokens on a cross-encoder: each pair's texts cut so that the
    pair reads as the Rust tokenizer's longest_first truncation at that length reads it."""
    engine = load_engine("m", onnx_model, Settings(), Metrics())
    pairs = [("a short query", "a much longer document, of hyphen-ated and naïve words"),
             ("Unbelievably long-winded questions are asked here", "short"),
             ("even", "odd")]
    assert engine.text.pair_specials == 3  # [CLS] a [SEP] b [SEP]
    for total in range(5, 30):
        cutter = engine.text._copy(max_length=total, strategy="longest_first")
        for pair, cut in zip(pairs, engine.text.pair_cuts(pairs, total)):
            assert pair[0].startswith(cut[0]) and pair[1].startswith(cut[1])
            assert engine.text.tokenize([cut], None)[0].ids == cutter.encode(*pair).ids
        # from the start: the tokenizer's cut, or less where it begins within a word
        cutter = engine.text._copy(max_length=total, strategy="longest_first", direction="left")
        for pair, cut in zip(pairs, engine.text.pair_cuts(pairs, total, "left")):
            assert pair[0].endswith(cut[0]) and pair[1].endswith(cut[1])
            read, theirs = engine.text.tokenize([cut], None)[0], cutter.encode(*pair)
            for side in (0, 1):
                ours = [i for i, s in zip(read.ids, read.sequence_ids) if s == side]
                kept = [i for i, s in zip(theirs.ids, theirs.sequence_ids) if s == side]
                assert len(ours) <= len(kept) and ours == kept[len(kept) - len(ours):]


class Deferred:
    """A backend that runs a batch only when it is collected: the GPU path, emulated on
    the CPU (``launch`` returns before the work is done)."""

    asynchronous = True

    def __init__(self, backend):
        self.backend, self.device, self.dtype = backend, backend.device, backend.dtype

    def __getattr__(self, name):  # the rest of the interface: the backend's
        return getattr(self.backend, name)

    def launch(self, inputs):
        return inputs

    def collect(self, inputs):
        return self.backend.run(inputs)


def defer(monkeypatch, kind: type[Deferred]) -> None:
    """Engines loaded from now on run their models behind ``kind``."""
    import distilserve.server.engine

    opened = distilserve.server.engine.open_backend
    monkeypatch.setattr(distilserve.server.engine, "open_backend", lambda *a, **k: kind(opened(*a, **k)))


def test_an_asynchronous_backend_starts_the_next_batch_before_collecting_the_last(
        torch_model, monkeypatch):
    """The GPU path, emulated on the CPU: a backend whose ``launch`` returns before the
    work is done (``asynchronous``) gets the next batch launched while one is in flight,
    never more than two; every input still gets its own output, the same as with a
    synchronous backend."""

    texts = [f"sentence {i} " + "word " * (i % 7) for i in range(40)]  # batches of 32 and 8
    expected = np.stack(_run(load_engine("m", torch_model, Settings(), Metrics()), texts).outputs)
    in_flight, most, both = [], [], threading.Event()

    class Overlapping(Deferred):
        def launch(self, inputs):
            in_flight.append(id(inputs))
            most.append(len(in_flight))
            if len(in_flight) == 2:
                both.set()
            return inputs

        def collect(self, inputs):
            both.wait(60)  # the device still busy with the first when the second starts
            in_flight.remove(id(inputs))
            return super().collect(inputs)

    defer(monkeypatch, Overlapping)
    got = np.stack(_run(load_engine("m", torch_model, Settings(), Metrics()), texts).outputs)
    assert max(most) == 2 and not in_flight  # overlapped, and everything collected
    assert np.allclose(got, expected, atol=1e-6)


def test_a_fill_mask_batch_decodes_its_masks_whether_run_or_started_and_collected(
        tmp_path, monkeypatch, exports):
    """Each input's output is its mask tokens' logits [M, V]: the decoder applied to its
    own mask vectors, in batches of several inputs, with a synchronous backend and with one
    that starts a batch and collects it later (a GPU's; the token ids go with the batch)."""

    source = checkpoint.save(checkpoint.new("bert", "tiny", "fill-mask"), tmp_path / "mlm")
    folder = tmp_path / "model"
    exports(source, folder, "onnx", task="fill-mask")
    texts = [f"word {i} [MASK] " + "[MASK] " * (i % 3) + "end" * (i % 2) for i in range(40)]
    engine = load_engine("m", folder, Settings(), Metrics())
    weight, bias = read_decoder(folder)
    vectors = engine.runner.backend.run(pad(engine.text.tokenize(texts[:1], "right")))[0]  # [T, E]
    ran = _run(engine, texts)  # outputs: (logits, encoding) each
    assert [logits.shape[0] for logits, _ in ran.outputs] == [1 + i % 3 for i in range(40)]
    # the first input's mask, as the decoder gives it on that input's vectors alone
    mask = ran.outputs[0][1].ids.index(engine.text.mask_id)
    np.testing.assert_allclose(ran.outputs[0][0][0], vectors[mask] @ weight.T + bias,
                               rtol=1e-4, atol=1e-4)

    class Copying(Deferred):
        def launch(self, inputs):
            return {**inputs}  # a copy: the batch's own ids must come back with it

    defer(monkeypatch, Copying)
    collected = _run(load_engine("m", folder, Settings(), Metrics()), texts)
    for (got, _), (expected, _) in zip(collected.outputs, ran.outputs):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_batch_is_postprocessed_once_whether_run_or_collected(
        onnx_model, tiny_checkpoints, tmp_path, monkeypatch, exports):
    """What every request does to its outputs unless it asks otherwise is done once per
    batch, on the model's thread (per request on the event loop, such small numpy calls
    cost a fifth of the throughput at 512 clients): a dense embedding model's unit vectors,
    a classifier's label scores, as Result.postprocessed beside the model's own outputs,
    with a synchronous backend and with one that starts a batch and collects it later. An
    NER model has none (its postprocessing is per request)."""
    texts = [f"sentence {i} " + "word " * (i % 7) for i in range(40)]  # batches of 32 and 8
    engine = load_engine("m", onnx_model, Settings(), Metrics())
    alone = engine.runner.backend.run(pad(engine.text.tokenize(texts[:1], "right")))[0]  # [D]
    ran = _run(engine, texts)
    assert ran.outputs[0].shape == alone.shape == (engine.dimensions,)
    np.testing.assert_allclose(ran.outputs[0], alone, rtol=1e-5, atol=1e-6)
    outputs, unit = np.stack(ran.outputs), np.stack(ran.postprocessed)  # [N, D]
    np.testing.assert_allclose(unit, outputs / np.linalg.norm(outputs, axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
    for task in ("classify", "ner"):
        exports(tiny_checkpoints["bert", task], tmp_path / task, "onnx")
    classified = _run(load_engine("c", tmp_path / "classify", Settings(), Metrics()), texts)
    logits, scores = np.stack(classified.outputs), np.stack(classified.postprocessed)  # [N, L]
    assert logits.shape == scores.shape == (len(texts), 2)
    np.testing.assert_allclose(scores, torch.softmax(torch.from_numpy(logits), -1).numpy(),
                               rtol=1e-5, atol=1e-6)
    assert _run(load_engine("n", tmp_path / "ner", Settings(), Metrics()),
                texts[:2]).postprocessed is None
    defer(monkeypatch, Deferred)
    collected = _run(load_engine("m", onnx_model, Settings(), Metrics()), texts)
    np.testing.assert_allclose(np.stack(collected.postprocessed), unit, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack(collected.outputs), outputs, rtol=1e-5, atol=1e-6)
    collected = _run(load_engine("c", tmp_path / "classify", Settings(), Metrics()), texts)
    np.testing.assert_allclose(np.stack(collected.postprocessed), scores, rtol=1e-5, atol=1e-6)


def test_on_a_gpu_the_warm_up_runs_every_batch_shape_the_largest_first(
        torch_model, monkeypatch, caplog):
    """A backend that says it is on a GPU (it runs on the CPU) gets two batches of each
    warm-up shape before the first request, the one needing the most memory first; one
    that cannot run that batch is not served, and the message says which limits to lower.
    The outputs' check at load runs before CUDA graphs are turned on, so that the warm-up
    is the first to capture them, in its order."""
    import distilserve.server.engine

    shapes, fail, graphs_after = [], [], []

    class OnGpu:
        asynchronous, device, dtype = False, "cuda:0", "fp16"

        def __init__(self, backend):
            self.backend = backend

        def __getattr__(self, name):  # the rest of the interface: the backend's
            return getattr(self.backend, name)

        def use_graphs(self, *args):
            graphs_after.append(len(shapes))
            return self.backend.use_graphs(*args)

        def run(self, inputs):
            shapes.append(inputs["input_ids"].shape)
            if fail:
                raise RuntimeError("CUDA out of memory")
            return self.backend.run(inputs)

    opened = distilserve.server.engine.open_backend
    monkeypatch.setattr(distilserve.server.engine, "open_backend", lambda *a, **k: OnGpu(opened(*a, **k)))
    settings = Settings(max_batch_size=8, max_batch_tokens=256)
    engine = load_engine("m", torch_model, settings, Metrics())

    async def start():
        await engine.start()
        await engine.stop()

    with caplog.at_level("INFO", logger="distilserve"):
        asyncio.run(start())
    # at load one input of max_length (the outputs' check), then two of each shape, then
    # the two warm-up requests of one text each
    assert shapes[0] == (1, engine.max_length) and graphs_after == [1]
    assert shapes[1:-2] == [s for s in engine.runner.shapes for _ in range(2)]
    assert engine.runner.shapes[0] == (256 // engine.max_length, engine.max_length)
    assert [b for b, _ in shapes[-2:]] == [1, 1]
    assert f"warmed m on cuda:0: {len(engine.runner.shapes)} batch shapes" in caplog.text

    engine = load_engine("m", torch_model, settings, Metrics())
    fail.append(True)
    shapes.clear()
    with pytest.raises(ModelLoadError, match=r"a warm-up batch of \d+ inputs x \d+ tokens "
                       r"failed on cuda:0 \(the largest .*DISTILSERVE_MAX_BATCH_TOKENS.*"
                       "out of memory"):
        asyncio.run(engine.start())
    assert len(shapes) == 1  # nothing after the failure

    monkeypatch.undo()
    cpu = load_engine("m", torch_model, settings, Metrics())  # the real backend: on the CPU
    monkeypatch.setattr(cpu.runner, "_warm_shapes", lambda: pytest.fail("swept on the CPU"))
    _run(cpu, ["one"])


def test_work_off_the_models_thread_runs_on_a_thread_that_then_ends():
    """Loading a model leaves no thread behind (PyTorch keeps a team of CPU threads for
    every living thread that ran a parallel op: the model's own thread then ran slower)."""
    threads = []

    def work(x):
        threads.append(threading.current_thread())
        if x is None:
            raise ValueError("no input")
        return 2 * x

    async def go():
        assert await on_own_thread(work, 21) == 42
        with pytest.raises(ValueError, match="no input"):
            await on_own_thread(work, None)
        # while the loop runs (its default executor's threads, asyncio.to_thread's, stay)
        wait_for(lambda: not any(t.is_alive() for t in threads), "the threads to end", 60)
    asyncio.run(go())
    assert len(threads) == 2 and threading.main_thread() not in threads


def test_pytorch_models_on_the_cpu_take_turns_on_the_thread_given(torch_model):
    """PyTorch keeps a team of CPU threads for every thread that runs its parallel ops, and
    each model's own thread made every small op wait: the service's models run on one."""
    from concurrent.futures import ThreadPoolExecutor

    cpu_thread = ThreadPoolExecutor(1, thread_name_prefix="torch-cpu")
    engines = [load_engine("a", torch_model, Settings(), Metrics(), cpu_thread),
               load_engine("b", torch_model, Settings(), Metrics(), cpu_thread),
               load_engine("c", torch_model, Settings(), Metrics())]  # none given: its own
    ran_on = {}
    for engine in engines:
        forward = engine.runner.backend.forward

        def recording(*args, forward=forward, name=engine.name):
            ran_on.setdefault(name, set()).add(threading.current_thread().name)
            return forward(*args)
        engine.runner.backend.forward = recording

    async def go():
        for engine in engines:
            await engine.start(warmup=False)
        await asyncio.gather(*(e.infer(["one", "two"], "right") for e in engines * 2))
        for engine in engines:
            await engine.stop()
    asyncio.run(go())
    cpu_thread.shutdown()
    assert ran_on == {"a": {"torch-cpu_0"}, "b": {"torch-cpu_0"}, "c": {"infer-c"}}


HEADS = [(family, task) for family in FAMILIES for task in TASKS] + [
    (family, task) for family in ("bert", "distilbert") for task in ("qa", "fill-mask")]


@pytest.mark.parametrize("fmt", ["torch", "torchscript"])
@pytest.mark.parametrize(("family", "task"), HEADS)
def test_every_head_serves_in_the_half_dtypes_its_export_passed(exports, family, task, fmt, tmp_path):
    """What a GPU runs, on the CPU: each family and task, in each half dtype the export's
    parity check passed (a TorchScript graph traced again at load in it; the torch
    format's checkpoint), through the engine, gives fp32's outputs' shapes, finite. The
    model-level checks (tests/models/test_dtypes.py) do not load a model folder."""
    labels = ["a", "b", "c"] if task in ("classify", "ner") else None
    source = checkpoint.save(checkpoint.new(family, "tiny", task, labels, seed=1),
                             tmp_path / "ck")
    manifest = exports(source, tmp_path / "m", fmt, task=task)
    texts = {"fill-mask": ["a [MASK] here", "two [MASK] and [MASK] words"],
             "qa": [("who?", "a context of some words")]}.get(task, ["hello", "a b c d"])
    outputs = {}
    for dtype in ("fp32", *(d for d in ("fp16", "bf16") if d in manifest.allowed_dtypes)):
        ran = _run(load_engine("m", tmp_path / "m", Settings(dtype=dtype), Metrics()), texts)
        outputs[dtype] = [np.asarray(o[0] if isinstance(o, tuple) else o, dtype=np.float32)
                          for o in ran.outputs]  # (output, encoding) for per-token tasks
    for dtype, got in outputs.items():
        assert [o.shape for o in got] == [o.shape for o in outputs["fp32"]], dtype
        assert all(np.isfinite(o).all() for o in got), dtype
