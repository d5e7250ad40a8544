"""models/io/sentence_transformers.py: a sentence-transformers folder's pooling and length,
as the export and the served model apply them, against sentence-transformers itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

from models import export
from models.io import checkpoint
from models.io import sentence_transformers as st
from models.runtime import open_backend

TEXTS = ["hello world", "a much longer sentence than the first, with a comma or two, and more"]


def _encoded(folder: Path) -> dict[str, np.ndarray]:
    enc = AutoTokenizer.from_pretrained(str(folder))(TEXTS, padding=True, return_tensors="np")
    return {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def bge_like(tmp_path_factory) -> Path:
    """A tiny BERT saved as sentence-transformers saves BGE: [CLS] pooling, normalised,
    trained at 64 tokens."""
    folder = checkpoint.save(checkpoint.new("bert", "tiny", "embed", seed=3),
                             tmp_path_factory.mktemp("bge") / "src")
    st.write(st.Pipeline("cls", 64, normalize=True), folder, 32)
    return folder


def test_a_cls_model_is_exported_and_served_as_sentence_transformers_computes_it(
        bge_like, tmp_path):
    expected = SentenceTransformer(str(bge_like), device="cpu").encode(TEXTS)
    manifest = export.export(bge_like, tmp_path / "m")
    assert (manifest.pooling, manifest.max_length) == ("cls", 64)
    inputs = _encoded(bge_like)
    onnx = open_backend("onnx", tmp_path / "m", manifest.artifact).run(inputs)
    assert np.abs(_unit(onnx) - expected).max() < 1e-5
    # the exported checkpoint says so too: the torch backend (and a GPU's fallback) pool alike
    torch_run = open_backend("torch", tmp_path / "m", None).run(inputs)
    assert np.abs(_unit(torch_run) - expected).max() < 1e-5
    again = SentenceTransformer(str(tmp_path / "m" / "checkpoint"), device="cpu")
    assert np.abs(again.encode(TEXTS) - expected).max() < 1e-6
    # as a GPU runs an ONNX model without onnxruntime-gpu (and a half-precision dtype):
    # its checkpoint traced with TorchScript, here on the CPU in fp32 and bf16
    from models.runtime.torchscript import TorchScriptBackend

    for dtype, tolerance in (("fp32", 1e-5), ("bf16", 3e-2)):
        traced = TorchScriptBackend(tmp_path / "m" / "checkpoint", dtype=dtype).run(inputs)
        assert np.abs(_unit(traced) - expected).max() < tolerance, dtype
    # the mean differs: a model served with the wrong pooling would be quietly off
    mean = export.export(bge_like, tmp_path / "mean", pooling="mean")
    assert mean.pooling == "mean"
    mean_run = open_backend("onnx", tmp_path / "mean", mean.artifact).run(inputs)
    assert np.abs(_unit(mean_run) - expected).max() > 1e-2


def test_pooling_can_be_chosen_for_a_checkpoint_without_sentence_transformers_files(
        tiny_checkpoints, tmp_path):
    plain = Path(tiny_checkpoints["bert", "embed"])
    assert checkpoint.load(plain).pooling == "mean"
    manifest = export.export(plain, tmp_path / "m", pooling="cls", max_length=32)
    assert manifest.pooling == "cls"
    assert checkpoint.load(tmp_path / "m" / "checkpoint").pooling == "cls"
    with pytest.raises(export.ExportError, match="--pooling applies to embedding models"):
        export.export(tiny_checkpoints["bert", "classify"], tmp_path / "c", pooling="cls")
    with pytest.raises(checkpoint.CheckpointError, match="pooled by mean, not cls"):
        export.export(tiny_checkpoints["minialbert", "embed"], tmp_path / "a", pooling="cls")


def test_the_embedded_teachers_files_say_mean_256_normalised():
    assert st.read(checkpoint.minilm_path()) == st.Pipeline("mean", 256, normalize=True)


@pytest.mark.parametrize("config,pooling", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
    ({"pooling_mode_mean_tokens": True}, "mean"),
    ({"word_embedding_dimension": 32}, "mean"),  # no flag set: sentence-transformers' mean
    ({"embedding_dimension": 32, "pooling_mode": "cls"}, "cls"),  # sentence-transformers 5
    ({"pooling_mode": ["mean"]}, "mean"),
])
def test_both_pooling_config_formats_are_read(bge_like, tmp_path, config, pooling):
    folder = tmp_path / "f"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "modules.json").write_text((bge_like / "modules.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    assert st.read(folder).pooling == pooling


@pytest.mark.parametrize("module,pooling,words", [
    ({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
     {"pooling_mode_mean_tokens": True}, "2_Dense (sentence_transformers.models.Dense)"),
    (None, {"pooling_mode_max_tokens": True}, "pooling max is not one distilserve computes"),
    (None, {"pooling_mode": ["cls", "mean"]}, "pooling cls + mean is not one"),
])
def test_what_would_change_the_embeddings_is_refused_naming_the_file(
        bge_like, tmp_path, module, pooling, words):
    source = tmp_path / "src"
    source.mkdir()
    for f in bge_like.rglob("*"):
        if f.is_file():
            (source / f.relative_to(bge_like)).parent.mkdir(parents=True, exist_ok=True)
            (source / f.relative_to(bge_like)).write_bytes(f.read_bytes())
    if module:
        modules = json.loads((source / "modules.json").read_text())
        (source / "modules.json").write_text(json.dumps([*modules, module]))
    (source / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(checkpoint.CheckpointError, match="modules.json|1_Pooling") as e:
        export.export(source, tmp_path / "m")
    assert words in str(e.value)
    assert not (tmp_path / "m").exists()


def test_prompts_are_read_and_carried_into_the_export(bge_like, tmp_path):
    source = tmp_path / "src"
    checkpoint.save(checkpoint.load(bge_like), source)
    config = {"prompts": {"query": "query: ", "passage": "passage: "},
              "default_prompt_name": "query"}
    (source / "config_sentence_transformers.json").write_text(json.dumps(config))
    assert st.read(source).prompts == config["prompts"]
    manifest = export.export(source, tmp_path / "m")
    assert (manifest.prompts, manifest.default_prompt_name) == (config["prompts"], "query")
    assert st.read(tmp_path / "m" / "checkpoint") == st.read(source)
    (source / "config_sentence_transformers.json").write_text(json.dumps(
        {**config, "default_prompt_name": "document"}))
    with pytest.raises(checkpoint.CheckpointError, match="'document' is not one of its "
                       "prompts \\(query, passage\\)"):
        checkpoint.load(source)


def test_the_older_layout_with_the_encoder_in_a_subfolder(bge_like, tmp_path):
    """sentence-transformers' older folders keep the encoder, its tokenizer and its
    sentence_bert_config.json in 0_Transformer/, beside 1_Pooling/."""
    old = tmp_path / "old"
    encoder = old / "0_Transformer"
    encoder.mkdir(parents=True)
    for f in bge_like.iterdir():
        if f.is_file() and f.name != "modules.json":
            (encoder / f.name).write_bytes(f.read_bytes())
    (encoder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    (old / "1_Pooling").mkdir()
    (old / "1_Pooling" / "config.json").write_bytes(
        (bge_like / "1_Pooling" / "config.json").read_bytes())
    (old / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer",
         "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    assert st.encoder_folder(old) == encoder
    expected = SentenceTransformer(str(old), device="cpu").encode(TEXTS)
    manifest = export.export(old, tmp_path / "m")
    assert (manifest.pooling, manifest.max_length) == ("cls", 40)
    got = open_backend("onnx", tmp_path / "m", manifest.artifact).run(_encoded(encoder))
    assert np.abs(got - expected).max() < 1e-5  # no Normalize module here: as it is


def test_token_embeddings_are_sentence_transformers_token_embeddings(bge_like, tmp_path):
    """Exported with --token-embeddings, every backend gives each token's vector as
    sentence-transformers' output_value="token_embeddings" does, and the service's pooling
    of them (postprocess.sentence_embeddings) gives the embeddings it gives."""
    from models.runtime.torchscript import TorchScriptBackend
    from server.postprocess import normalize, sentence_embeddings

    model = SentenceTransformer(str(bge_like), device="cpu")
    expected = model.encode(TEXTS, output_value="token_embeddings")  # [T_i, D] each
    manifest = export.export(bge_like, tmp_path / "m", token_embeddings=True)
    assert (manifest.pooling, manifest.token_embeddings, manifest.dimensions) == ("cls", True, 32)
    inputs = _encoded(bge_like)
    lengths = inputs["attention_mask"].sum(1)
    folder = tmp_path / "m"
    for name, backend in (
            ("onnx", open_backend("onnx", folder, manifest.artifact, token_embeddings=True)),
            ("torch", open_backend("torch", folder, None, token_embeddings=True)),
            ("traced checkpoint", TorchScriptBackend(folder / "checkpoint",
                                                     token_embeddings=True))):
        out = backend.run(inputs)  # [B, T, D]
        assert out.shape == (*inputs["input_ids"].shape, 32), name
        tokens = [row[:n] for row, n in zip(out, lengths)]
        for got, want in zip(tokens, expected):
            assert got.shape == tuple(want.shape) and np.abs(got - want.numpy()).max() < 1e-5
        pooled = normalize(sentence_embeddings(tokens, manifest.pooling))
        assert np.abs(pooled - model.encode(TEXTS)).max() < 1e-5, name
