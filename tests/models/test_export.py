import json
import os
import re
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import AutoTokenizer

from distilserve.models import export, families, samples
from distilserve.models.io import checkpoint
from distilserve.models.io.manifest import Manifest
from distilserve.models.runtime import open_backend
from distilserve.server.cli import main
from distilserve.server.core.postprocess import sentence_embeddings
from tests.conftest import FAMILIES, Exports

CASES = [(family, fmt, loop)
         for family in FAMILIES for fmt in ("onnx", "torchscript")
         for loop in (("unroll", "keep") if family in families.RECURSIVE else ("unroll",))]
TASK_OF = {"bert": "ner", "distilbert": "classify", "minialbert": "ner",
           "falbert": "classify", "cmow": "ner"}


def _fresh_inputs(batch=4, length=23):
    """A shape unlike the export example (2 x 8) and the parity check's, with padding."""
    g = np.random.default_rng(7)
    ids = g.integers(1000, 30000, (batch, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[2, 9:] = 0
    types = np.zeros_like(ids)
    types[0, 12:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}



@pytest.mark.parametrize("task", ["embed", "classify"])
def test_an_unchecked_export_is_the_checked_one_without_the_checks_record(
        tiny_checkpoints, tmp_path, task):
    """check=False writes the same artifact and manifest less the parity and dtype checks:
    the model then runs in any dtype its family runs in."""
    src = tiny_checkpoints["bert", task]
    checked = export.export(src, tmp_path / "checked", "onnx")
    unchecked = export.export(src, tmp_path / "unchecked", "onnx", check=False)
    assert checked.parity is not None and checked.dtypes is not None
    assert (unchecked.parity, unchecked.dtypes) == (None, None)
    assert unchecked.allowed_dtypes == list(families.get("bert").dtypes)
    left_out = {"parity", "dtypes", "export_seconds"}
    assert unchecked.model_dump(exclude=left_out) == checked.model_dump(exclude=left_out)
    inputs = _fresh_inputs()
    a, b = (open_backend("onnx", tmp_path / name, "model.onnx").run(inputs)
            for name in ("checked", "unchecked"))
    np.testing.assert_array_equal(a, b)


def test_the_exports_fixture_gives_the_export_and_makes_each_once(exports, tiny_checkpoints,
                                                                  tmp_path, monkeypatch):
    """tests/conftest.py's ``exports``, which most of the suite's model folders come from:
    what ``export`` gives, exported once and copied when asked for again, also for the
    same files elsewhere (another pytest-xdist worker's checkpoint), naming them."""
    src = tiny_checkpoints["cmow", "classify"]
    made = exports(src, tmp_path / "a", "onnx", check=False)
    direct = export.export(src, tmp_path / "direct", "onnx", check=False)
    timed = {"export_seconds"}
    assert made.model_dump(exclude=timed) == direct.model_dump(exclude=timed)
    elsewhere = shutil.copytree(src, tmp_path / "elsewhere")
    monkeypatch.setattr(export, "export", lambda *args, **kw: pytest.fail("exported again"))
    again = exports(elsewhere, tmp_path / "b", "onnx", check=False)
    assert again == made.model_copy(update={"source": str(elsewhere)})
    assert Manifest.read(tmp_path / "b") == again
    inputs = _fresh_inputs()
    a, b = (open_backend("onnx", tmp_path / name, "model.onnx").run(inputs)
            for name in ("b", "direct"))
    np.testing.assert_array_equal(a, b)


def test_the_exports_fixtures_copies_link_large_files_and_a_write_into_one_fails_the_run(tmp_path):
    folder = tmp_path / "model"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(bytes(Exports.LINKED_FROM))
    (folder / "manifest.json").write_text("{}")
    (folder / "checkpoint" / "model.safetensors").write_bytes(bytes(Exports.LINKED_FROM + 1))
    for file in folder.rglob("*"):  # made a while ago (the clock's tick is coarser than ns)
        os.utime(file, (0, 0))
    exports = Exports(tmp_path / "exports")
    exports.copy(folder, tmp_path / "a")
    exports.copy(tmp_path / "a", tmp_path / "b")
    for name in ("model.onnx", "checkpoint/model.safetensors"):
        assert (folder / name).stat().st_nlink == 3  # the one file, in three folders
    assert (tmp_path / "b" / "manifest.json").stat().st_nlink == 1
    (tmp_path / "a" / "manifest.json").write_text('{"task": "embed"}')  # a copy: its own
    assert (folder / "manifest.json").read_text() == "{}"
    (tmp_path / "b" / "model.onnx").unlink()  # replaced: the others keep theirs
    (tmp_path / "b" / "model.onnx").write_bytes(b"broken")
    exports.check_untouched()
    with open(tmp_path / "b" / "checkpoint" / "model.safetensors", "r+b") as f:
        f.write(b"broken")  # into the one file: every copy's
    with pytest.raises(AssertionError, match=r"wrote into \['\S+/model/checkpoint/model\."):
        exports.check_untouched()


@pytest.mark.parametrize("family,fmt,loop", CASES)
def test_export_reloads_and_matches_pytorch_at_other_shapes(tiny_checkpoints, tmp_path,
                                                            family, fmt, loop):
    task = TASK_OF[family]
    src = tiny_checkpoints[family, task]
    manifest = export.export(src, tmp_path / "repo" / "m", fmt, loop)
    folder = tmp_path / "repo" / "m"
    assert json.loads((folder / "manifest.json").read_text()) == manifest.model_dump(mode="json")
    assert manifest.parity["max_abs_diff"] <= 1e-4
    assert (manifest.task, manifest.family, manifest.backend) == (task, family, fmt)
    inputs = _fresh_inputs()
    with torch.no_grad():
        ref = checkpoint.load(src).model(*(torch.from_numpy(inputs[k]) for k in
                                           ("input_ids", "attention_mask", "token_type_ids")))
    if fmt == "onnx":
        session = ort.InferenceSession(str(folder / "model.onnx"))
        names = [i.name for i in session.get_inputs()]
        feed = {k: v for k, v in inputs.items() if k in names}
        if "num_iterations" in names:
            feed["num_iterations"] = np.array(manifest.num_iterations)
        got = session.run(None, feed)[0]
    else:
        module = torch.jit.load(str(folder / "model.ts"))
        with torch.no_grad():
                got = module(*(torch.from_numpy(inputs[k]) for k in
                           ("input_ids", "attention_mask", "token_type_ids"))).numpy()
    assert np.abs(got - ref.numpy()).max() <= 1e-4


@pytest.mark.parametrize("family,fmt,loop", [
    ("minialbert", "onnx", "keep"), ("minialbert", "torchscript", "keep"),
    ("falbert", "onnx", "unroll"), ("distilbert", "torchscript", "unroll")])
def test_token_embeddings_are_the_vectors_the_model_pools(tiny_checkpoints, tmp_path, family,
                                                         fmt, loop):
    src = tiny_checkpoints[family, "embed"]
    manifest = export.export(src, tmp_path / "m", fmt, loop, token_embeddings=True)
    assert (manifest.token_embeddings, manifest.pooling, manifest.dimensions) == (True, "mean",
                                                                                 32)
    assert all(d["passed"] for d in manifest.dtypes.values())  # fp16, bf16: token cosines
    inputs = _fresh_inputs()
    got = open_backend(fmt, tmp_path / "m", manifest.artifact,
                       num_iterations=manifest.num_iterations, token_embeddings=True).run(inputs)
    assert got.shape == (4, 23, 32)  # [B, T, D]
    with torch.no_grad():
        pooled = checkpoint.load(src).model(*(torch.from_numpy(inputs[k]) for k in
                                              ("input_ids", "attention_mask", "token_type_ids")))
    tokens = [row[:n] for row, n in zip(got, inputs["attention_mask"].sum(1))]
    assert np.abs(sentence_embeddings(tokens, "mean") - pooled.numpy()).max() <= 1e-4


def test_token_embeddings_are_refused_where_there_are_none(tiny_checkpoints, tmp_path, capsys):
    for family, task, why in (("cmow", "embed", "a cmow model has no token embeddings"),
                              ("bert", "ner", "an embedding model's, not this ner model's")):
        out = tmp_path / family
        assert main(["export", tiny_checkpoints[family, task], "--output", str(out),
                     "--token-embeddings"]) == 1
        err = capsys.readouterr().err
        assert f"{tiny_checkpoints[family, task]}: " in err and why in err
        assert not out.exists()
    assert main(["export", tiny_checkpoints["bert", "embed"], "--output", str(tmp_path / "t"),
                 "--token-embeddings"]) == 0
    assert "mean pooling of its token embeddings" in capsys.readouterr().out


@pytest.mark.parametrize("family", families.RECURSIVE)
def test_keep_has_a_loop_and_unroll_is_not_bigger(tiny_checkpoints, tmp_path, family):
    src = tiny_checkpoints[family, "embed"]
    graphs = {}
    for loop in ("unroll", "keep"):
        export.export(src, tmp_path / loop, "onnx", loop)
        graphs[loop] = onnx.load(str(tmp_path / loop / "model.onnx"))
    loops = {k: sum(n.op_type == "Loop" for n in g.graph.node) for k, g in graphs.items()}
    assert loops == {"unroll": 0, "keep": 1}

    def weight_bytes(g):
        return sum(onnx.numpy_helper.to_array(t).nbytes for t in g.graph.initializer)

    # the shared layer is stored once: not L times larger
    assert weight_bytes(graphs["unroll"]) <= 1.05 * weight_bytes(graphs["keep"])


def test_keep_form_depth_is_a_runtime_input(tiny_checkpoints, tmp_path):
    src = tiny_checkpoints["minialbert", "embed"]
    export.export(src, tmp_path / "m", "onnx", "keep")
    session = ort.InferenceSession(str(tmp_path / "m" / "model.onnx"))
    inputs = _fresh_inputs()
    del inputs["token_type_ids"]
    model = checkpoint.load(src).model
    for depth in (1, 2, 3):
        got = session.run(None, {**inputs, "token_type_ids": np.zeros_like(inputs["input_ids"]),
                                 "num_iterations": np.array(depth)})[0]
        with torch.no_grad():
            ref = model.forward_iterations(*(torch.from_numpy(x) for x in (
                inputs["input_ids"], inputs["attention_mask"],
                np.zeros_like(inputs["input_ids"]))), depth).numpy()
        assert np.abs(got - ref).max() <= 1e-4


@pytest.mark.slow  # the real MiniLM, exported and quantised
def test_real_minilm_exports_to_onnx_and_int8_keeps_embeddings(tmp_path, recwarn):
    manifest = export.export(checkpoint.minilm_path(), tmp_path / "minilm", "onnx",
                             quantize="int8", max_length=256)
    # transformers' mask code, traced, warns of a constant the export accounts for
    assert not [w for w in recwarn if issubclass(w.category, torch.jit.TracerWarning)]
    assert manifest.parity["max_abs_diff"] <= 1e-4
    assert manifest.artifact == "model.int8.onnx"
    assert manifest.quantization["min_cosine"] >= 0.99
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "minilm" / "checkpoint"))
    enc = tok(samples.SENTENCES, padding=True, return_tensors="np")
    feed = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    fp32 = ort.InferenceSession(str(tmp_path / "minilm" / "model.onnx")).run(None, feed)[0]
    int8 = ort.InferenceSession(str(tmp_path / "minilm" / "model.int8.onnx")).run(None, feed)[0]
    cos = (fp32 * int8).sum(-1) / np.linalg.norm(fp32, axis=-1) / np.linalg.norm(int8, axis=-1)
    assert len(cos) >= 30 and cos.min() >= 0.99


def _fp32_weight_matmuls(graph: onnx.GraphProto, known: frozenset = frozenset()) -> list[str]:
    """MatMuls, in ``graph`` and the loop bodies in it, that multiply by a float weight:
    one computed from stored tensors and constants alone (read directly, through an
    Identity, or sliced and transposed in a loop's body), whatever the loop counter."""
    known = known | {t.name for t in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in known:
            found.append(node.name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found += _fp32_weight_matmuls(attr.g, frozenset(known))
        if node.op_type == "Constant" or node.input and all(i in known for i in node.input):
            known |= set(node.output)
    return found


@pytest.mark.parametrize("model,loop", [(m, loop) for m in ("minialbert", "falbert", "lr-albert")
                                        for loop in ("unroll", "keep")])
def test_int8_quantises_every_reuse_of_the_shared_layer(tiny_checkpoints, tmp_path, model, loop,
                                                        caplog):
    """Only the down-projections stay fp32 (the rule of quantize_int8). Unrolled, the
    exporter hands a shared weight to every reuse after the first through an Identity, and
    those reuses stayed fp32; kept as a loop, the FFN's weights were sliced (to their full
    width) in the loop's body, and stayed fp32 at every reuse. (F-ALBERT's cut FFN, kept
    as a loop, is sliced at run time: not a stored weight, so fp32.)"""
    if model == "lr-albert":  # every reuse with the whole FFN (tiny F-ALBERT cuts it)
        src = checkpoint.save(checkpoint.new("falbert", "tiny", "embed",
                                             overrides={"connection_schedule": []}),
                              tmp_path / "ckpt")
    else:
        src = tiny_checkpoints[model, "embed"]
    manifest = export.export(src, tmp_path / "m", "onnx", loop, quantize="int8")
    int8 = onnx.load(str(tmp_path / "m" / "model.int8.onnx"))
    assert sorted(_fp32_weight_matmuls(int8.graph)) == sorted(manifest.quantization["kept_fp32"])
    assert manifest.quantization["min_cosine"] >= 0.99
    # onnxruntime's advice to pre-process first, which cannot be taken for a kept loop
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()]


def test_corrupt_checkpoint_exits_non_zero_and_writes_nothing(tmp_path, capsys):
    src = checkpoint.save(checkpoint.new("falbert", "tiny"), tmp_path / "ckpt")
    (src / "model.safetensors").write_bytes(b"\x00" * 64)
    assert main(["export", str(src), "--output", str(tmp_path / "repo" / "m")]) == 1
    assert "model.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


@pytest.mark.parametrize("own_tokenizer", [True, False], ids=["its own", "none"])
def test_a_tokenizer_past_the_embedding_table_is_refused(tmp_path, capsys, own_tokenizer):
    """A model of 1,000 tokens with bert-base-uncased's 30,522 (its own files, or the
    default where it has none): each id from 1,000 up would fail in the model."""
    src = checkpoint.save(checkpoint.new("cmow", "tiny", overrides={"vocab_size": 1000}),
                          tmp_path / "ckpt")
    if not own_tokenizer:
        for name in checkpoint.TOKENIZER_FILES:
            (src / name).unlink(missing_ok=True)
    assert main(["export", str(src), "--output", str(tmp_path / "repo" / "m")]) == 1
    err = capsys.readouterr().err
    assert "has 30522 tokens, but the model's embedding table has 1000 rows" in err
    assert ("has no tokenizer of its own" in err) is not own_tokenizer
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_failed_parity_leaves_nothing_servable(tiny_checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(export, "TOLERANCE", -1.0)
    with pytest.raises(export.ExportError, match="differs from PyTorch"):
        export.export(tiny_checkpoints["cmow", "embed"], tmp_path / "repo" / "m")
    assert list((tmp_path / "repo").iterdir()) == []


class _Outputs:
    """A backend whose outputs are ``value`` at every batch."""
    name = "onnx"

    def __init__(self, value: float):
        self.value = value

    def run(self, inputs):
        return np.full((len(inputs["input_ids"]), 4), self.value, np.float32)


class _Model(torch.nn.Module):
    """PyTorch's outputs: ``value``, or ``overflow`` in a batch's second row."""

    def __init__(self, value: float, overflow: float | None = None):
        super().__init__()
        self.value, self.overflow = value, overflow

    def forward(self, ids, mask, types):
        out = torch.full((len(ids), 4), self.value)
        if self.overflow is not None and len(ids) > 1:
            out[1] = self.overflow
        return out


def _parity_batches():
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint.default_tokenizer_dir()))
    return export.parity_inputs(tokenizer, 16, "embed")


@pytest.mark.parametrize("model, artifact, said", [
    (_Model(1.0), float("nan"), "onnx outputs hold NaN or infinity at inputs of shape (1, 5), "
                                "where PyTorch's are finite"),
    (_Model(1.0), float("inf"), "onnx outputs hold NaN or infinity"),
    (_Model(float("nan")), float("nan"), "PyTorch's own outputs hold NaN or infinity at every "
                                         "sample input: nothing to check the onnx artifact")])
def test_outputs_holding_nan_or_infinity_are_no_difference_of_zero(model, artifact, said):
    """max() takes a difference of NaN for none at all: the check says what it is."""
    batches = _parity_batches()
    with pytest.raises(ValueError, match=re.escape(said)):
        export.compare(model, _Outputs(artifact), batches)
    parity, _ = export.compare(_Model(1.0), _Outputs(1.0), batches)
    assert parity["max_abs_diff"] == 0


def test_an_input_past_the_range_of_float32_in_pytorch_is_left_out_of_the_comparison():
    """As the service refuses it (CMOW's products, on a long text); the others compared."""
    parity, references = export.compare(_Model(1.0, float("inf")), _Outputs(2.0),
                                        _parity_batches())
    assert parity["max_abs_diff"] == 1.0  # the finite rows' difference, not NaN's or 0
    assert np.isinf(references[1][1]).all()


def test_keep_is_refused_for_a_family_without_a_loop(tiny_checkpoints, tmp_path):
    with pytest.raises(export.ExportError, match="recursive"):
        export.export(tiny_checkpoints["bert", "embed"], tmp_path / "m", "onnx", "keep")


def test_tracing_a_transformers_model_says_nothing_of_a_loss():
    """Tracing reads every attribute, transformers' loss_function too, which logged that it
    would use a causal-LM loss: a line at every export and GPU load, about nothing."""
    import logging

    from transformers.utils import logging as hf_logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    hf_logging.warning_once.cache_clear()  # it logs once per process
    try:
        export.trace(checkpoint.new("bert", "tiny", "embed").model)
    finally:
        library.removeHandler(handler)
    assert not [r for r in records if "loss" in r.getMessage()]


def test_the_manifest_has_the_special_tokens_where_tokenizer_json_alone_is_the_tokenizer(
        tmp_path):
    """What the service takes from transformers' tokenizer (then it serves without
    transformers: tests/e2e/test_without_torch.py), where checkpoint/tokenizer.json read
    alone is transformers' tokenizer; nothing where tokenizer_config.json changes it."""
    folder = checkpoint.save(checkpoint.new("bert", "tiny", "ner"), tmp_path / "ckpt")
    hf = AutoTokenizer.from_pretrained(folder)
    assert export._tokenizer_facts(folder).model_dump() == {
        "unk_token_id": hf.unk_token_id, "cls_token_id": hf.cls_token_id,
        "mask_token": "[MASK]", "mask_token_id": hf.mask_token_id,
        "clean_up_tokenization_spaces": hf.clean_up_tokenization_spaces}
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    assert AutoTokenizer.from_pretrained(folder)("Hello").input_ids != hf("Hello").input_ids
    assert export._tokenizer_facts(folder) is None


def test_an_exported_folder_has_the_umasks_modes(tiny_checkpoints, tmp_path):
    """Readable by a service that runs as another user (a container's, a volume's): the
    folder and everything in it as the umask makes them, not 0700."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        export.export(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "m", "onnx")
    finally:
        os.umask(old)
    folder = tmp_path / "repo" / "m"
    modes = {p.relative_to(folder).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [folder, *folder.rglob("*")]}
    assert modes["."] == modes["checkpoint"] == 0o755
    assert modes["manifest.json"] == modes["model.onnx"] == 0o644
    assert all(mode in (0o755, 0o644) for mode in modes.values()), modes
    assert [p.name for p in (tmp_path / "repo").iterdir()] == ["m"]  # no staging left
