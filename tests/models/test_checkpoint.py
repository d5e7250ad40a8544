import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

from distilserve.models import export
from distilserve.models.io import checkpoint
from distilserve.models.io.checkpoint import CheckpointError
from tests.conftest import FAMILIES, TASKS, batch


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("task", TASKS)
def test_save_load_round_trips_bit_for_bit(tiny_checkpoints, family, task):
    path = tiny_checkpoints[family, task]
    loaded = checkpoint.load(path)
    assert (loaded.family, loaded.task) == (family, task)
    again = checkpoint.load(checkpoint.save(loaded, f"{path}-again"))
    a, b = loaded.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ids, mask, types = batch()
    with torch.no_grad():
        assert torch.equal(loaded.model(ids, mask, types), again.model(ids, mask, types))


@pytest.mark.parametrize("family", FAMILIES)
def test_labels_and_task_come_back(tmp_path, family):
    ckpt = checkpoint.new(family, "tiny", "classify", ["bad", "neutral", "good"])
    loaded = checkpoint.load(checkpoint.save(ckpt, tmp_path))
    assert loaded.labels == ["bad", "neutral", "good"]
    assert loaded.model(*batch()).shape == (3, 3)
    # the encoder of a classifier loads as an embedding model (its head is dropped)
    assert checkpoint.load(tmp_path, task="embed").task == "embed"


@pytest.mark.parametrize("family", ["bert", "minialbert"])  # transformers' config, our own
def test_a_head_is_not_loaded_as_another_tasks_head(tiny_checkpoints, family):
    """A sequence classifier's head has the shape of a token classifier's: loaded as one it
    would serve NER from weights trained for another task. An encoder asked for a head
    says which tensors it lacks, and why."""
    with pytest.raises(CheckpointError, match=r"a classify model: its head does not do ner"):
        checkpoint.load(tiny_checkpoints[family, "classify"], task="ner")
    with pytest.raises(CheckpointError, match=r"(missing: |needs id2label).*an encoder "
                       r"without a classify head"):
        checkpoint.load(tiny_checkpoints[family, "embed"], task="classify")


@pytest.mark.parametrize("family", ["bert", "cmow"])  # transformers' config, and our own
def test_labels_are_in_their_ids_order_and_a_bad_id2label_is_named(tmp_path, family):
    path = checkpoint.save(checkpoint.new(family, "tiny", "classify", ["a", "b", "c"]),
                           tmp_path)
    config = json.loads((path / "config.json").read_text())
    config.pop("label2id", None)
    for id2label, labels in [({"2": "c", "0": "a", "1": "b"}, ["a", "b", "c"]),
                             ({"0": "a", "2": "b", "3": "c"}, None),  # no 1
                             ({"x": "a", "y": "b", "z": "c"}, None),
                             (["a", "b", "c"], None), ({"0": 1, "1": 2, "2": 3}, None)]:
        (path / "config.json").write_text(json.dumps({**config, "id2label": id2label}))
        if labels:
            assert checkpoint.load(path).labels == labels
        else:
            with pytest.raises(CheckpointError, match=r"config.json: id2label must map the "
                                                      r"ids 0, 1, \.\.\."):
                checkpoint.load(path)


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_a_question_answering_model_is_transformers_own(tmp_path, family):
    """Saved as transformers saves BertForQuestionAnswering (qa_outputs): it loads back as
    qa, with no labels, and gives each token's start and end logits, [B, T, 2]."""
    saved = checkpoint.save(checkpoint.new(family, "tiny", "qa"), tmp_path / family)
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"][0].endswith("ForQuestionAnswering")
    loaded = checkpoint.load(saved)
    assert (loaded.task, loaded.labels) == ("qa", [])
    ids, mask, types = batch()
    with torch.no_grad():
        ours = loaded.model(ids, mask, types)
        theirs = AutoModelForQuestionAnswering.from_pretrained(saved).eval()(
            input_ids=ids, attention_mask=mask,
            **({"token_type_ids": types} if family == "bert" else {}))
    assert ours.shape == (*ids.shape, 2)
    assert torch.equal(ours[..., 0], theirs.start_logits)
    assert torch.equal(ours[..., 1], theirs.end_logits)


@pytest.mark.parametrize("family", ["minialbert", "falbert", "cmow"])
def test_the_other_families_have_no_question_answering_head(family):
    with pytest.raises(CheckpointError, match=f"{family} has no question-answering head"):
        checkpoint.new(family, "tiny", "qa")
    with pytest.raises(CheckpointError, match="labels are for classify and ner models, not qa"):
        checkpoint.new("bert", "tiny", "qa", ["start", "end"])


def test_truncated_safetensors_names_the_file(tmp_path):
    path = checkpoint.save(checkpoint.new("minialbert", "tiny"), tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        checkpoint.load(path)


@pytest.mark.parametrize("family", ["bert", "minialbert", "cmow"])
def test_wrong_shape_and_missing_tensors_are_named(tmp_path, family):
    path = checkpoint.save(checkpoint.new(family, "tiny", "classify"), tmp_path / "m")
    weights = path / "model.safetensors"
    state = load_file(weights)
    victim = sorted(k for k in state if "weight" in k)[0]
    state[victim] = torch.zeros(3, 3)
    del state["classifier.bias"]
    save_file(state, weights)
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(path)
    assert str(weights) in str(e.value)
    assert victim in str(e.value) and "wrong shape" in str(e.value)
    assert "classifier.bias" in str(e.value) and "missing" in str(e.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_tensors_holding_nan_or_infinity_are_named(tmp_path, bad):
    """A checkpoint saved from a training run that diverged: every output would be NaN."""
    path = checkpoint.save(checkpoint.new("bert", "tiny"), tmp_path / "m")
    weights = path / "model.safetensors"
    state = load_file(weights)
    victim = sorted(k for k in state if k.endswith("weight"))[-1]
    state[victim][0] = bad
    save_file(state, weights)
    with pytest.raises(CheckpointError, match=f"^{weights}: NaN or infinity in 1 of its "
                                              f"tensors: {victim}$"):
        checkpoint.load(path)


def test_a_checkpoint_without_a_pooler_is_an_embedding_model_but_no_classifier(
        splade_checkpoint):
    """transformers' pooler never runs for an embedding, and a checkpoint saved from a
    masked-language model has none; a classifier runs it, so there it is missing."""
    from transformers import BertModel

    ckpt = checkpoint.load(splade_checkpoint, pooling="mean")
    ids, mask, types = batch()
    reference = BertModel.from_pretrained(str(splade_checkpoint), add_pooling_layer=False)
    with torch.no_grad():
        hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
        assert torch.allclose(ckpt.model(ids, mask, types), expected, atol=1e-5)
    with pytest.raises(CheckpointError, match="missing: bert.pooler.dense.bias"):
        checkpoint.load(splade_checkpoint, task="classify")


def test_pickled_bin_is_loaded_only_as_tensors(tmp_path):
    path = checkpoint.save(checkpoint.new("minialbert", "tiny"), tmp_path / "m")
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    torch.save(state, path / "pytorch_model.bin")
    assert checkpoint.load(path).family == "minialbert"

    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    torch.save({"x": Evil()}, path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        checkpoint.load(path)


def test_bad_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        checkpoint.load(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(CheckpointError, match="gpt2"):
        checkpoint.load(tmp_path)
    with pytest.raises(CheckpointError, match=f"^{tmp_path / 'config.json'}: not a folder"):
        checkpoint.load(tmp_path / "config.json")  # the file given for its folder
    with pytest.raises(CheckpointError, match=f"^{tmp_path / 'gone'}: no such folder"):
        checkpoint.load(tmp_path / "gone")


@pytest.mark.parametrize("family,preset,published,tolerance", [
    ("bert", "bert-base", 109e6, 0.05),
    ("distilbert", "distilbert", 66e6, 0.05),
    ("bert", "tinybert-4l", 14.5e6, 0.05),
    ("falbert", "albert-base", 11.7e6, 0.05),
    ("minialbert", "minialbert-128", 12.1e6, 0.05),
    ("cmow", "cmow-hybrid-bidi", 36.6e6, 0.05),
])
def test_paper_presets_have_the_published_sizes(family, preset, published, tolerance):
    n = checkpoint.new(family, preset).num_parameters()
    assert abs(n - published) / published <= tolerance, n


def _slow_tokenizer_only(folder: Path, tokenizer_config: dict) -> Path:
    """A tiny BERT checkpoint whose tokenizer is a slow one's files only, as older
    checkpoints ship it (TinyBERT's: vocab.txt and no tokenizer.json)."""
    folder = checkpoint.save(checkpoint.new("bert", "tiny", "embed"), folder)
    for name in ("tokenizer.json", "special_tokens_map.json"):
        (folder / name).unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


def test_a_checkpoints_own_vocabulary_is_kept_without_a_tokenizer_json(tmp_path):
    source = _slow_tokenizer_only(tmp_path / "src", {"do_lower_case": False,
                                                     "tokenizer_class": "BertTokenizer"})
    vocab = (source / "vocab.txt").read_text().splitlines()
    vocab[2000] = "Paris"  # a cased word: the default vocabulary is uncased
    (source / "vocab.txt").write_text("\n".join(vocab) + "\n")
    loaded = checkpoint.load(source)
    assert loaded.tokenizer_dir == source
    saved = checkpoint.save(loaded, tmp_path / "saved")  # as the fast tokenizer the service runs
    assert (saved / "tokenizer.json").exists()
    assert AutoTokenizer.from_pretrained(str(saved)).tokenize("Paris") == ["Paris"]


def test_a_tokenizer_that_does_not_load_is_named_and_nothing_is_exported(tmp_path):
    source = _slow_tokenizer_only(tmp_path / "src", {"tokenizer_class": "AlbertTokenizer"})
    (source / "spiece.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(checkpoint.CheckpointError, match="src: its tokenizer"):
        export.export(source, tmp_path / "repo" / "m")
    assert not (tmp_path / "repo" / "m").exists()


def test_a_config_without_model_type_is_known_by_its_architecture_or_tensors(tmp_path):
    """Older configs (TinyBERT's among them) have no model_type, and fields of their own;
    their weights hold a distillation projection to the teacher's width and an MLM head
    beside the encoder. transformers infers the type from the path, distilserve from the
    architecture or the tensors' names."""
    ref = checkpoint.new("bert", "tiny", "embed", seed=4)
    config = {k: v for k, v in ref.model.model.config.to_dict().items()
              if k not in ("model_type", "architectures")}
    config |= {"cell": {}, "emb_size": 32, "pre_trained": "", "structure": []}
    state = {f"bert.{k}": v for k, v in ref.model.model.state_dict().items()}
    state |= {"fit_dense.weight": torch.zeros(8, 32), "cls.predictions.bias": torch.zeros(9)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = checkpoint.load(tmp_path)
    assert (loaded.family, loaded.task) == ("bert", "embed")
    ids, mask, types = batch()
    with torch.no_grad():
        assert torch.equal(loaded.model(ids, mask, types), ref.model(ids, mask, types))
    # an architecture alone names it too
    (tmp_path / "config.json").write_text(json.dumps(
        {**config, "architectures": ["BertForMaskedLM"]}))
    assert checkpoint.load(tmp_path).family == "bert"
    # base models, no prefix: their own layouts tell BERT, DistilBERT and MobileBERT apart
    for family, preset, model_type in (("bert", "tiny", "bert"),
                                       ("distilbert", "tiny", "distilbert"),
                                       ("bert", "mobilebert", "mobilebert")):
        keys = dict.fromkeys(checkpoint.new(family, preset, "embed").model.model.state_dict())
        assert checkpoint.hf_model_type({}, keys, tmp_path) == model_type
    # neither: said, naming the file
    torch.save({"encoder.weight": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="config.json: no model_type"):
        checkpoint.load(tmp_path)
