"""distilserve/models/io/manifest.py: one typed manifest; a bad one is an error naming file and field."""

from __future__ import annotations

import json

import pytest

from distilserve.models.io.manifest import Manifest, ManifestError

GOOD = {"task": "embed", "family": "bert", "backend": "onnx", "max_length": 128,
        "artifact": "model.onnx", "dimensions": 32}


def write(folder, data):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(data))
    return folder


def test_a_manifest_round_trips_with_what_others_add(tmp_path):
    folder = write(tmp_path / "m", {**GOOD, "training": {"seed": 0}})
    manifest = Manifest.read(folder)
    assert (manifest.task, manifest.max_length, manifest.dimensions) == ("embed", 128, 32)
    assert manifest.training == {"seed": 0}  # kept: the embedded default's record
    manifest.write(folder)
    assert Manifest.read(folder) == manifest


@pytest.mark.parametrize("change,words", [
    ({"task": "translate"}, "task: Input should be 'embed', 'classify', 'ner', 'qa' or 'fill-mask'"),
    ({"max_length": 0}, "max_length: Input should be greater than 0"),
    ({"max_length": "long"}, "max_length: Input should be a valid integer"),
    ({"artifact": "../../etc/passwd"}, "artifact: Value error, '../../etc/passwd' must be a "
                                       "file in the folder"),
    ({"backend": None}, "backend: Input should be 'onnx', 'torchscript' or 'torch'"),
    ({"family": "gpt2"}, "family: Value error, 'gpt2' is not one of bert, distilbert, "
                         "minialbert, falbert, cmow"),
    ({"pooling": "median"}, "manifest: Value error, pooling 'median' is not one of mean, "
                            "cls, max, mean_sqrt_len_tokens, weightedmean, splade"),
    ({"pooling": "cmow"}, "pooling 'cmow' is not one of"),  # CMOW's own, not BERT's
    ({"dimensions": -1}, "dimensions: Input should be greater than 0"),
    ({"num_iterations": 0}, "num_iterations: Input should be greater than 0"),
    ({"prompts": {"query": "query: "}, "default_prompt_name": "passage"},
     "manifest: Value error, default_prompt_name 'passage' is not one of its prompts (query)"),
])
def test_an_invalid_manifest_names_its_file_and_field(tmp_path, change, words):
    folder = write(tmp_path / "m", {**GOOD, **change})
    with pytest.raises(ManifestError) as raised:
        Manifest.read(folder)
    assert str(raised.value).startswith(str(folder / "manifest.json"))
    assert words in str(raised.value)


def test_missing_and_unreadable_manifests(tmp_path):
    with pytest.raises(ManifestError, match="manifest.json: missing"):
        Manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ManifestError, match="not a JSON object"):
        Manifest.read(tmp_path)
    data = dict(GOOD)
    del data["family"]
    write(tmp_path, data)
    with pytest.raises(ManifestError, match="family: Field required"):
        Manifest.read(tmp_path)


def test_tokenizer_facts_say_how_transformers_decodes():
    """The special tokens, and whether transformers' decode is the Rust tokenizer's then a
    clean-up (the service then decodes without transformers); None for a class of its own."""
    from transformers import AutoTokenizer

    from distilserve.models.io import checkpoint
    from distilserve.models.io.manifest import TokenizerFacts

    tokenizer = AutoTokenizer.from_pretrained(checkpoint.minilm_path())
    facts = TokenizerFacts.of(tokenizer)
    assert (facts.unk_token_id, facts.cls_token_id, facts.mask_token, facts.mask_token_id) == (
        100, 101, "[MASK]", 103)
    assert facts.clean_up_tokenization_spaces is False  # all-MiniLM-L6-v2's tokenizer_config
    tokenizer.clean_up_tokenization_spaces = True
    assert TokenizerFacts.of(tokenizer).clean_up_tokenization_spaces is True

    class OwnDecode(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):
            return "its own"

    tokenizer.__class__ = OwnDecode
    assert TokenizerFacts.of(tokenizer).clean_up_tokenization_spaces is None
