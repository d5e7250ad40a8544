import pytest
import torch
from transformers import AlbertConfig, AlbertModel

from distilserve.models.falbert import PRESETS, FAlbert, FAlbertConfig
from distilserve.models.io import checkpoint
from distilserve.models.layers import attention_bias
from tests.conftest import batch


def _albert_pair(schedule=None):
    c = FAlbertConfig(**{**PRESETS["tiny"], "connection_schedule": schedule or []})
    hf = AlbertModel(AlbertConfig(
        vocab_size=c.vocab_size, embedding_size=c.embedding_size, hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size, hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings)).eval()
    ours = FAlbert(c).eval()
    ours.load_state_dict({"albert." + k: v for k, v in hf.state_dict().items()}, strict=True)
    return hf, ours


def _hidden(model, ids, mask, types):
    x, bias = model.embed(ids, types), attention_bias(mask, torch.float32)
    for i in range(model.num_iterations):
        x, _ = model.iterate(x, bias, i, False)
    return x


def test_full_schedule_equals_transformers_albert():
    hf, ours = _albert_pair()
    ids, mask, types = batch()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = _hidden(ours, ids, mask, types)
    real = mask.bool()
    assert (ref - got)[real].abs().max() <= 1e-5


def test_shrinking_schedule_uses_fewer_flops_and_changes_outputs():
    _, full = _albert_pair([4, 4, 4, 4])
    _, shrunk = _albert_pair([4, 4, 3, 2])
    shrunk.load_state_dict(full.state_dict())
    assert shrunk.ffn_flops_per_token() < full.ffn_flops_per_token()
    assert shrunk.ffn_widths == [64, 64, 48, 32]
    ids, mask, types = batch()
    with torch.no_grad():
        assert not torch.allclose(shrunk(ids, mask, types), full(ids, mask, types))


@pytest.mark.parametrize("bad", [[4, 3, 4, 2], [5, 4, 4, 4], [4, 4]])
def test_schedule_is_validated(bad):
    with pytest.raises(ValueError):
        FAlbertConfig(**{**PRESETS["tiny"], "connection_schedule": bad})


def test_albert_checkpoint_loads_as_lr_albert(tmp_path):
    hf, _ = _albert_pair()
    hf.save_pretrained(tmp_path)
    lr = checkpoint.load(tmp_path, overrides={"model_type": "falbert", "num_hidden_layers": 2,
                                              "connection_schedule": []})
    assert lr.family == "falbert" and lr.model.num_iterations == 2
    as_is = checkpoint.load(tmp_path, overrides={"model_type": "falbert",
                                                 "connection_schedule": []})
    ids, mask, types = batch()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = _hidden(as_is.model, ids, mask, types)
    assert (ref - got)[mask.bool()].abs().max() <= 1e-5


def test_the_large_presets_are_albert_large_and_its_half_reuse_students():
    large = FAlbertConfig(**PRESETS["albert-large"])
    assert (large.hidden_size, large.num_attention_heads, large.intermediate_size,
            large.num_hidden_layers) == (1024, 16, 4096, 24)
    lr, f = FAlbertConfig(**PRESETS["lr-albert-large"]), FAlbertConfig(**PRESETS["falbert-large"])
    assert lr.num_hidden_layers == f.num_hidden_layers == 12
    assert lr.ffn_widths == [4096] * 12
    # the base schedule's three steps (all parts, one fewer, two fewer), each a third
    assert f.ffn_widths == [4096] * 4 + [3072] * 4 + [2048] * 4
