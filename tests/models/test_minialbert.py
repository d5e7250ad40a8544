import json
import math

import torch
import torch.nn.functional as F

from distilserve.models.io import checkpoint
from distilserve.models.minialbert import PRESETS, MiniAlbert, MiniAlbertConfig
from tests.conftest import batch

L, D, E, H, FF, R = 3, 32, 16, 4, 64, 4  # the tiny preset


def _nlpie_state(seed=0):
    """A state dict laid out as nlpie's MiniALBERT checkpoints, with random values."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    s = {}
    emb = "albert.albert.embeddings."
    s[emb + "word_embeddings.weight"] = r(30522, E)
    s[emb + "position_embeddings.weight"] = r(128, E)
    s[emb + "token_type_embeddings.weight"] = r(2, E)
    s[emb + "LayerNorm.weight"], s[emb + "LayerNorm.bias"] = 1 + r(E), r(E)
    lay = "albert.albert.encoder.albert_layer_groups.0.albert_layers.0."
    for name in ["query", "key", "value", "dense"]:
        s[f"{lay}attention.{name}.weight"], s[f"{lay}attention.{name}.bias"] = r(D, D), r(D)
    for ln in ["attention.LayerNorm", "full_layer_layer_norm"]:
        s[f"{lay}{ln}.weight"], s[f"{lay}{ln}.bias"] = 1 + r(D), r(D)
    s[lay + "ffn.weight"], s[lay + "ffn.bias"] = r(FF, D), r(FF)
    s[lay + "ffn_output.weight"], s[lay + "ffn_output.bias"] = r(D, FF), r(D)
    s["albert.projector.weight"], s["albert.projector.bias"] = r(D, E), r(D)
    for kind in ["att_adapters", "mlp_adapters"]:
        for i in range(L):
            p = f"albert.{kind}.{i}."
            s[p + "block.0.weight"], s[p + "block.0.bias"] = r(D // R, D), r(D // R)
            s[p + "block.2.weight"], s[p + "block.2.bias"] = r(D, D // R), r(D)
            s[p + "norm.weight"], s[p + "norm.bias"] = 1 + r(D), r(D)
    s["classifier.weight"], s["classifier.bias"] = r(2, D), r(2)
    return s


def _reference(s, ids, mask, types):
    """The paper's equations written out plainly, from the nlpie tensors."""
    emb, lay = "albert.albert.embeddings.", "albert.albert.encoder.albert_layer_groups.0.albert_layers.0."
    x = (s[emb + "word_embeddings.weight"][ids] + s[emb + "position_embeddings.weight"][: ids.shape[1]]
         + s[emb + "token_type_embeddings.weight"][types])
    x = F.layer_norm(x, (E,), s[emb + "LayerNorm.weight"], s[emb + "LayerNorm.bias"], 1e-12)
    x = x @ s["albert.projector.weight"].T + s["albert.projector.bias"]

    def lin(h, name):
        return h @ s[name + ".weight"].T + s[name + ".bias"]

    def ln(h, name):
        return F.layer_norm(h, (D,), s[name + ".weight"], s[name + ".bias"], 1e-12)

    def adapter(h, p):  # phi(x) = LayerNorm(W_up act(W_down x) + x)
        return ln(lin(F.gelu(lin(h, p + "block.0")), p + "block.2") + h, p + "norm")

    def heads(h):
        b, t, _ = h.shape
        return h.view(b, t, H, D // H).transpose(1, 2)

    for i in range(L):
        h = adapter(x, f"albert.att_adapters.{i}.")
        q, k, v = (heads(lin(h, lay + "attention." + n)) for n in ["query", "key", "value"])
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // H)
        scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(h.shape)
        a = ln(h + lin(ctx, lay + "attention.dense"), lay + "attention.LayerNorm")
        a = adapter(a, f"albert.mlp_adapters.{i}.")
        x = ln(a + lin(F.gelu(lin(a, lay + "ffn")), lay + "ffn_output"), lay + "full_layer_layer_norm")
    return lin(x[:, 0], "classifier")


def test_loads_nlpie_layout_from_pickled_bin_and_matches_the_equations(tmp_path):
    state = _nlpie_state()
    config = {**MiniAlbertConfig(**PRESETS["tiny"]).__dict__,
              "architectures": ["MiniAlbertForSequenceClassification"],
              "id2label": {"0": "a", "1": "b"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save(state, tmp_path / "pytorch_model.bin")
    ckpt = checkpoint.load(tmp_path)
    ids, mask, types = batch()
    with torch.no_grad():
        got = ckpt.model(ids, mask, types)
    assert (got - _reference(state, ids, mask, types)).abs().max() <= 1e-5
    saved = ckpt.model.checkpoint_state_dict()  # saved back under the same names
    assert set(saved) == set(state)


def _bert_config_as_nlpie_uploaded(**fields) -> dict:
    """config.json as nlpie's first MiniALBERT uploads have it: a BERT config (model_type
    "bert", BERT's own fields) with MiniALBERT's fields added."""
    return {"model_type": "bert", "hidden_dropout_prob": 0.1, "initializer_range": 0.02,
            "position_embedding_type": "absolute", "pad_token_id": 0,
            **{k: v for k, v in MiniAlbertConfig(**PRESETS["tiny"]).__dict__.items()
               if k != "model_type"}, **fields}


def test_loads_nlpie_uploads_whose_config_says_bert(tmp_path):
    from safetensors.torch import save_file

    state = _nlpie_state()
    # a sequence classifier, named by its architecture
    (tmp_path / "config.json").write_text(json.dumps(_bert_config_as_nlpie_uploaded(
        architectures=["MiniAlbertForSequenceClassification"], id2label={"0": "a", "1": "b"})))
    save_file(state, str(tmp_path / "model.safetensors"))
    ckpt = checkpoint.load(tmp_path)
    assert (ckpt.family, ckpt.task, ckpt.labels) == ("minialbert", "classify", ["a", "b"])
    ids, mask, types = batch()
    with torch.no_grad():
        assert (ckpt.model(ids, mask, types) - _reference(state, ids, mask, types)).abs().max() <= 1e-5
    # the masked-LM upload, no architecture named: known by its nested albert.albert.*
    # tensors; its MLM head and the ALBERT pooler are dropped
    encoder = {k: v for k, v in state.items() if not k.startswith("classifier")}
    encoder |= {"vocab_projector.weight": torch.zeros(30522, 32),
                "albert.albert.pooler.weight": torch.zeros(32, 32)}
    (tmp_path / "config.json").write_text(json.dumps(_bert_config_as_nlpie_uploaded(
        id2label={"0": "LABEL_0", "1": "LABEL_1"})))
    save_file(encoder, str(tmp_path / "model.safetensors"))
    ckpt = checkpoint.load(tmp_path)
    assert (ckpt.family, ckpt.task) == ("minialbert", "embed")
    saved = checkpoint.save(ckpt, tmp_path / "saved")
    assert json.loads((saved / "config.json").read_text())["model_type"] == "minialbert"
    # nlpie's newer uploads spell it "MiniAlbert"
    config = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**config, "model_type": "MiniAlbert",
                                                   "architectures": []}))
    assert checkpoint.load(saved).family == "minialbert"


def test_one_shared_layer_and_stacked_adapters():
    m = MiniAlbert(MiniAlbertConfig(**PRESETS["tiny"]))
    assert sum("albert_layers.0." in k for k, _ in m.named_parameters()) == 16
    assert m.albert.att_adapters.down_weight.shape == (L, D // R, D)


def test_depth_is_a_runtime_choice_and_scripting_keeps_the_loop():
    m = MiniAlbert(MiniAlbertConfig(**PRESETS["tiny"])).eval()
    ids, mask, types = batch()
    scripted = torch.jit.script(m)
    with torch.no_grad():
        assert torch.allclose(scripted(ids, mask, types), m(ids, mask, types), atol=1e-6)
        two, three = m.forward_iterations(ids, mask, types, 2), m.forward_iterations(ids, mask, types, 3)
    assert not torch.allclose(two, three)
    assert "prim::Loop" in str(scripted.forward_iterations.graph)


def test_no_adapter_variant():
    m = MiniAlbert(MiniAlbertConfig(**{**PRESETS["tiny"], "use_adapter": False}))
    assert not any("adapters" in k for k in m.state_dict())
