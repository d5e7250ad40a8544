"""distilserve/models/io/sentence_transformers.py: a sentence-transformers folder's pooling and length,
as the export and the served model apply them, against sentence-transformers itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

from distilserve.models import export
from distilserve.models.io import checkpoint
from distilserve.models.io import sentence_transformers as st
from distilserve.models.runtime import open_backend

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
    from distilserve.models.runtime.torchscript import TorchScriptBackend

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


def _copy(source: Path, folder: Path) -> Path:
    for f in source.rglob("*"):
        if f.is_file():
            (folder / f.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (folder / f.relative_to(source)).write_bytes(f.read_bytes())
    return folder


@pytest.mark.parametrize("module,pooling,words", [
    ({"idx": 3, "name": "3", "path": "3_Layer", "type": "sentence_transformers.models.LayerNorm"},
     {"pooling_mode_mean_tokens": True}, "3_Layer (sentence_transformers.models.LayerNorm)"),
    (None, {"pooling_mode_lasttoken": True}, "pooling lasttoken is not one distilserve computes"),
    (None, {"pooling_mode": "mean", "include_prompt": False}, "include_prompt false"),
    (None, {"pooling_mode": ["cls", "mean"]}, "pooling cls + mean is not one"),
])
def test_what_would_change_the_embeddings_is_refused_naming_the_file(
        bge_like, tmp_path, module, pooling, words):
    source = _copy(bge_like, tmp_path / "src")
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
    from distilserve.models.runtime.torchscript import TorchScriptBackend
    from distilserve.server.core.postprocess import normalize, sentence_embeddings

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


@pytest.fixture(scope="module")
def labse_like(tmp_path_factory) -> Path:
    """A tiny BERT saved by sentence-transformers as LaBSE is (distiluse's DistilBERT
    students too, with the mean): pooled, then a Dense module through a tanh to another
    width, normalised."""
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )
    from torch import nn

    root = tmp_path_factory.mktemp("labse")
    encoder = checkpoint.save(checkpoint.new("bert", "tiny", "embed", seed=5), root / "encoder")
    model = SentenceTransformer(modules=[Transformer(str(encoder)), Pooling(32, "cls"),
                                         Dense(32, 16, activation_function=nn.Tanh()),
                                         Normalize()], device="cpu")
    model.save(str(root / "st"))
    return root / "st"


def test_a_dense_module_is_exported_and_served_as_sentence_transformers_computes_it(
        labse_like, tmp_path):
    from distilserve.models.runtime.torchscript import TorchScriptBackend

    expected = SentenceTransformer(str(labse_like), device="cpu").encode(TEXTS)  # [2, 16]
    pipeline = st.read(labse_like)
    assert (pipeline.pooling, pipeline.dense) == ("cls", st.Dense("2_Dense", 32, 16, True, "Tanh"))
    folder = tmp_path / "m"
    manifest = export.export(labse_like, folder)
    assert manifest.dimensions == 16
    inputs = _encoded(labse_like)
    for name, backend in (("onnx", open_backend("onnx", folder, manifest.artifact)),
                          ("torch", open_backend("torch", folder, None)),
                          ("traced checkpoint", TorchScriptBackend(folder / "checkpoint"))):
        assert np.abs(_unit(backend.run(inputs)) - expected).max() < 1e-5, name
    again = SentenceTransformer(str(folder / "checkpoint"), device="cpu")
    assert np.abs(again.encode(TEXTS) - expected).max() < 1e-6
    assert st.read(folder / "checkpoint") == pipeline
    # older sentence-transformers saved the Dense module's weights as pytorch_model.bin
    import torch
    from safetensors.torch import load_file

    source = _copy(labse_like, tmp_path / "bin")
    weights = source / "2_Dense" / "model.safetensors"
    torch.save(load_file(str(weights)), source / "2_Dense" / "pytorch_model.bin")
    weights.unlink()
    manifest = export.export(source, tmp_path / "from-bin")
    got = open_backend("onnx", tmp_path / "from-bin", manifest.artifact).run(inputs)
    assert np.abs(_unit(got) - expected).max() < 1e-5


@pytest.mark.parametrize("change,words", [
    ({"activation_function": "torch.nn.modules.activation.Softmax"},
     "2_Dense/config.json: activation torch.nn.modules.activation.Softmax is not one"),
    ({"activation_function": "mypackage.Tanh"}, "activation mypackage.Tanh is not one"),
    ({"module_input_name": "token_embeddings"},
     "2_Dense/config.json: a Dense module on token_embeddings is not one"),
    ({"out_features": "16"}, "in_features and out_features must be positive integers"),
    ({"out_features": 8}, "2_Dense/model.safetensors: tensors do not fit the model"),
])
def test_a_dense_module_not_computed_here_is_refused_naming_the_file(labse_like, tmp_path,
                                                                       change, words):
    source = _copy(labse_like, tmp_path / "src")
    file = source / "2_Dense" / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **change}))
    with pytest.raises(checkpoint.CheckpointError) as e:
        export.export(source, tmp_path / "m")
    assert words in str(e.value)
    assert not (tmp_path / "m").exists()


def test_a_dense_module_is_refused_before_the_pooling_after_its_own_family_and_for_tokens(
        labse_like, tiny_checkpoints, tmp_path):
    source = _copy(labse_like, tmp_path / "src")
    modules = json.loads((source / "modules.json").read_text())
    modules[1], modules[2] = modules[2], modules[1]  # Dense, then Pooling
    (source / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(checkpoint.CheckpointError, match="2_Dense comes before the pooling"):
        checkpoint.load(source)
    with pytest.raises(checkpoint.CheckpointError, match="no --token-embeddings"):
        export.export(labse_like, tmp_path / "t", token_embeddings=True)
    albert = _copy(Path(tiny_checkpoints["minialbert", "embed"]), tmp_path / "albert")
    _copy(labse_like / "2_Dense", albert / "2_Dense")
    st.write(st.read(labse_like), albert, 32)
    with pytest.raises(checkpoint.CheckpointError, match="after a minialbert encoder it is "
                       "not computed here"):
        checkpoint.load(albert)


def test_a_splade_model_is_exported_and_served_as_sentence_transformers_computes_it(
        splade_checkpoint, tmp_path):
    """SPLADE (sentence-transformers' SparseEncoder): a masked-language model's logits,
    log(1 + relu) of them, the largest over the real tokens, a weight per vocabulary
    entry; its ONNX and int8 artifacts, its torch model and its checkpoint traced as on a
    GPU give what SparseEncoder.encode gives, and so does the exported checkpoint, loaded
    by sentence-transformers."""
    from sentence_transformers import SparseEncoder

    from distilserve.models.runtime.torchscript import TorchScriptBackend

    model = SparseEncoder(str(splade_checkpoint), device="cpu")
    expected = model.encode(TEXTS).to_dense().numpy()  # [2, 30522]
    assert st.read(splade_checkpoint).pooling == "splade"
    folder = tmp_path / "m"
    manifest = export.export(splade_checkpoint, folder, quantize="int8")
    assert (manifest.pooling, manifest.dimensions) == ("splade", 30522)
    assert manifest.quantization["min_cosine"] > 0.99
    inputs = _encoded(splade_checkpoint)
    for name, backend in (("onnx", open_backend("onnx", folder, "model.onnx")),
                          ("torch", open_backend("torch", folder, None)),
                          ("traced checkpoint", TorchScriptBackend(folder / "checkpoint"))):
        assert np.abs(backend.run(inputs) - expected).max() < 1e-5, name
    again = SparseEncoder(str(folder / "checkpoint"), device="cpu")
    assert np.abs(again.encode(TEXTS).to_dense().numpy() - expected).max() < 1e-6
    # the masked-language model alone, without sentence-transformers' files: --pooling
    plain = export.export(splade_checkpoint, tmp_path / "plain", pooling="splade")
    assert plain.pooling == "splade"


def test_what_splade_cannot_be_is_refused(splade_checkpoint, tiny_checkpoints, tmp_path):
    source = _copy(splade_checkpoint, tmp_path / "sum")
    (source / "1_SpladePooling" / "config.json").write_text(json.dumps(
        {"pooling_strategy": "sum", "activation_function": "relu"}))
    with pytest.raises(checkpoint.CheckpointError, match="SPLADE pooling sum of relu is not "
                       "one distilserve computes \\(max of relu\\)"):
        checkpoint.load(source)
    with pytest.raises(checkpoint.CheckpointError, match="it has no token embeddings"):
        export.export(splade_checkpoint, tmp_path / "t", token_embeddings=True)
    # a model without a masked-language head has no logits to pool: its tensors say so
    with pytest.raises(checkpoint.CheckpointError, match="missing: cls.predictions.*SPLADE "
                       "pools a masked-language model's logits: its checkpoint has that head"):
        export.export(tiny_checkpoints["bert", "embed"], tmp_path / "b", pooling="splade")
    with pytest.raises(checkpoint.CheckpointError, match="pooled by mean, not splade"):
        export.export(tiny_checkpoints["minialbert", "embed"], tmp_path / "a", pooling="splade")


def test_a_distilbert_masked_language_model_is_splade_too(tmp_path):
    """naver's distilled SPLADE is a DistilBERT masked-language model, published without
    sentence-transformers' files; transformers saves its head's decoder once, as the word
    embeddings it is tied to."""
    import torch
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    torch.manual_seed(1)
    model = DistilBertForMaskedLM(DistilBertConfig(dim=32, n_layers=2, n_heads=4,
                                                   hidden_dim=64, max_position_embeddings=128))
    model.eval().save_pretrained(tmp_path / "mlm")
    for name in checkpoint.TOKENIZER_FILES:
        if (checkpoint.default_tokenizer_dir() / name).exists():
            (tmp_path / "mlm" / name).write_bytes(
                (checkpoint.default_tokenizer_dir() / name).read_bytes())
    manifest = export.export(tmp_path / "mlm", tmp_path / "m", pooling="splade")
    inputs = _encoded(tmp_path / "mlm")
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(inputs["input_ids"]),
                       attention_mask=torch.from_numpy(inputs["attention_mask"])).logits
    mask = torch.from_numpy(inputs["attention_mask"])[:, :, None]
    expected = torch.log1p(torch.relu(logits * mask)).amax(1).numpy()
    got = open_backend("onnx", tmp_path / "m", manifest.artifact).run(inputs)
    assert np.abs(got - expected).max() < 1e-5


@pytest.mark.parametrize("mode", ["max", "mean_sqrt_len_tokens", "weightedmean"])
def test_every_pooling_is_computed_as_sentence_transformers_computes_it(mode, tmp_path):
    """In the exported graph, and by the service from a --token-embeddings export's
    vectors."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from distilserve.server.core.postprocess import sentence_embeddings

    encoder = checkpoint.save(checkpoint.new("bert", "tiny", "embed", seed=7), tmp_path / "enc")
    model = SentenceTransformer(modules=[Transformer(str(encoder)),
                                         Pooling(32, pooling_mode=mode)], device="cpu")
    model.save(str(tmp_path / "st"))
    expected = model.encode(TEXTS)
    inputs = _encoded(tmp_path / "st")
    pooled = export.export(tmp_path / "st", tmp_path / "pooled")
    assert pooled.pooling == st.read(tmp_path / "pooled" / "checkpoint").pooling == mode
    got = open_backend("onnx", tmp_path / "pooled", pooled.artifact).run(inputs)
    assert np.abs(got - expected).max() < 1e-5
    tokens = export.export(tmp_path / "st", tmp_path / "tokens", token_embeddings=True)
    out = open_backend("onnx", tmp_path / "tokens", tokens.artifact,
                       token_embeddings=True).run(inputs)
    rows = [row[:n] for row, n in zip(out, inputs["attention_mask"].sum(1))]
    assert np.abs(sentence_embeddings(rows, mode) - expected).max() < 1e-5
