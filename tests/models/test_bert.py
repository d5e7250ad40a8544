import pytest
import torch
from transformers import AutoTokenizer

from distilserve.models import bert
from distilserve.models.io import checkpoint
from distilserve.models.io.checkpoint import CheckpointError
from tests.conftest import batch


def test_real_minilm_loads_offline_and_embeds_meaningfully():
    ckpt = checkpoint.load(checkpoint.minilm_path())
    assert (ckpt.family, ckpt.task) == ("bert", "embed")
    tok = AutoTokenizer.from_pretrained(ckpt.tokenizer_dir)
    texts = ["A man is playing a guitar.", "Someone plays an acoustic guitar.",
             "The stock market fell sharply today."]
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        e = ckpt.model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    e = torch.nn.functional.normalize(e, dim=-1)
    related, unrelated = e[0] @ e[1], e[0] @ e[2]
    assert related > 0.5 > unrelated


def _academic_budget_names(state):
    out = {}
    for k, v in state.items():
        k = k.replace(".attention.output.LayerNorm.", ".PreAttentionLayerNorm.")
        k = k.replace(".output.LayerNorm.", ".PostAttentionLayerNorm.")
        k = k.replace(".intermediate.dense.", ".intermediate.dense_act.")
        out[k] = v
    return out


def test_academic_budget_bert_student_converts_exactly(tmp_path):
    ref = checkpoint.new("bert", "tiny", "embed", seed=3)
    checkpoint.save(ref, tmp_path)
    state = {"bert." + k: v for k, v in ref.model.model.state_dict().items()}
    renamed = _academic_budget_names(state)
    assert any("PreAttentionLayerNorm" in k for k in renamed)
    from safetensors.torch import save_file
    save_file(renamed, tmp_path / "model.safetensors")
    loaded = checkpoint.load(tmp_path)
    ids, mask, types = batch()
    with torch.no_grad():
        assert torch.equal(loaded.model(ids, mask, types), ref.model(ids, mask, types))


def test_academic_budget_bert_refuses_what_it_cannot_map(tmp_path):
    ref = checkpoint.new("bert", "tiny", "embed")
    checkpoint.save(ref, tmp_path)
    renamed = _academic_budget_names({"bert." + k: v for k, v in ref.model.model.state_dict().items()})
    renamed["bert.encoder.FinalLayerNorm.weight"] = torch.ones(32)  # a pre-LN model
    from safetensors.torch import save_file
    save_file(renamed, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="FinalLayerNorm"):
        checkpoint.load(tmp_path)


def test_key_converter_covers_the_fused_dense_act():
    state = {"bert.encoder.layer.0.intermediate.dense_act.weight": torch.ones(1),
             "bert.encoder.layer.0.intermediate.dense_act.dense.bias": torch.ones(1)}
    assert set(bert.convert_academic_budget_bert(state)) == {
        "bert.encoder.layer.0.intermediate.dense.weight",
        "bert.encoder.layer.0.intermediate.dense.bias"}


def test_distilbert_ignores_token_types():
    ckpt = checkpoint.new("distilbert", "tiny", "embed")
    ids, mask, types = batch()
    with torch.no_grad():
        assert torch.equal(ckpt.model(ids, mask, types), ckpt.model(ids, mask, types + 1))


@pytest.mark.parametrize("family, overrides", [
    ("bert", None), ("distilbert", None),
    ("bert", {"model_type": "albert", "embedding_size": 16})])  # ALBERT's narrower head
def test_fill_mask_gives_the_language_models_logits_through_its_decoder(tmp_path, family,
                                                                        overrides):
    """The model stops before the decoder; its vectors through the decoder are the masked
    language model's logits, and the checkpoint (with its head) loads back as fill-mask."""
    ckpt = checkpoint.new(family, "tiny", "fill-mask", seed=2, overrides=overrides)
    ids, mask, types = batch()
    with torch.no_grad():
        vectors = ckpt.model(ids, mask, types)  # [B, T, E]
        logits = ckpt.model.model(input_ids=ids, attention_mask=mask).logits  # [B, T, V]
    decoder = bert.decoder(ckpt.model)
    assert vectors.shape[-1] == decoder["weight"].shape[1] == (16 if overrides else 32)
    torch.testing.assert_close(vectors @ decoder["weight"].T + decoder["bias"], logits)
    loaded = checkpoint.load(checkpoint.save(ckpt, tmp_path / "mlm"), task="fill-mask")
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids, mask, types), vectors)
    # unnamed, a masked-language model is an embedding model (as before fill-mask)
    assert checkpoint.load(tmp_path / "mlm").task == "embed"


def test_fill_mask_refuses_what_has_no_language_model_head(tmp_path):
    with pytest.raises(CheckpointError, match="its checkpoint has it"):
        checkpoint.load(checkpoint.save(checkpoint.new("bert", "tiny", "embed"),
                                        tmp_path / "base"), task="fill-mask")
    with pytest.raises(CheckpointError, match="no fill-mask head"):
        checkpoint.new("minialbert", "tiny", "fill-mask")


def test_a_pre_training_checkpoint_fills_masks_as_its_language_model(tmp_path):
    """bert-base-uncased's layout: BertForPreTraining, its next-sentence head and pooler
    beside the masked-language head (left out, as transformers leaves them out)."""
    import shutil

    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    pretrained = BertForPreTraining(BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128)).eval()
    pretrained.save_pretrained(tmp_path)
    shutil.copy(checkpoint.default_tokenizer_dir() / "vocab.txt", tmp_path)
    ckpt = checkpoint.load(tmp_path, task="fill-mask")
    ids, mask, types = batch()
    with torch.no_grad():
        logits = ckpt.model(ids, mask, types) @ bert.decoder(ckpt.model)["weight"].T \
            + bert.decoder(ckpt.model)["bias"]
        expected = pretrained(input_ids=ids, attention_mask=mask,
                              token_type_ids=types).prediction_logits
    torch.testing.assert_close(logits, expected)
