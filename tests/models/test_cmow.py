import torch

from distilserve.models.cmow import (
    PRESETS,
    Cmow,
    CmowConfig,
    prefix_products,
    sequential_product,
    tree_product,
)
from distilserve.models.io import checkpoint
from tests.conftest import batch


def _model(task="embed", labels=0):
    torch.manual_seed(0)
    return Cmow(CmowConfig(**PRESETS["tiny"]), task, labels).eval()


def test_tree_reduction_equals_sequential_product_at_every_length():
    m = _model()
    for n in [1, 2, 3, 7, 8, 9, 33, 100]:
        ids = torch.randint(1000, 30000, (2, n))
        x = m.transformer.embeddings.matrix_embedding(ids, torch.ones_like(ids))
        eye = torch.eye(x.shape[-1])
        assert torch.allclose(tree_product(x, m.steps, eye), sequential_product(x), atol=1e-5), n
        prefixes = prefix_products(x, m.steps, eye)
        assert torch.allclose(prefixes[:, -1], sequential_product(x), atol=1e-5)
        assert torch.allclose(prefixes[:, n // 2], sequential_product(x[:, : n // 2 + 1]), atol=1e-5)


def test_padding_changes_no_sentence():
    for task, labels in [("embed", 0), ("ner", 5), ("classify", 2)]:
        m = _model(task, labels)
        ids, mask, types = batch(3, 12)
        with torch.no_grad():
            padded = m(ids, mask, types)
            alone = m(ids[1:2, :6], mask[1:2, :6], types[1:2, :6])
        if task == "ner":
            assert torch.allclose(padded[1, :6], alone[0], atol=1e-5)
        else:
            assert torch.allclose(padded[1], alone[0], atol=1e-5)


def test_backward_direction_differs_and_pooled_layout():
    m = _model()
    ids, mask, types = batch(2, 9, pad_row=None)
    with torch.no_grad():
        out = m(ids, mask, types)
    d2 = 16
    assert out.shape == (2, 16 + 2 * d2)
    fw, bw = out[:, 16:16 + d2], out[:, 16 + d2:]
    assert not torch.allclose(fw, bw)
    # the backward part is Y_n ... Y_1, from its own table
    e = m.transformer.embeddings
    assert torch.allclose(
        bw.view(2, 4, 4),
        sequential_product(e.backward_matrix_embedding(ids, mask).flip(1)), atol=1e-5)


def test_pairs_are_diffcat_of_separate_encodings():
    m = _model("classify", 2)
    a, b = torch.randint(1000, 30000, (1, 5)), torch.randint(1000, 30000, (1, 4))
    ids = torch.cat([a, b], 1)
    types = torch.cat([torch.zeros_like(a), torch.ones_like(b)], 1)
    enc = _model("embed")
    enc.load_state_dict(m.state_dict(), strict=False)
    with torch.no_grad():
        ea, eb = enc(a, torch.ones_like(a), a * 0), enc(b, torch.ones_like(b), b * 0)
        expected = m.classifier(torch.cat([ea, eb, (ea - eb).abs()], 1))
        assert torch.allclose(m(ids, torch.ones_like(ids), types), expected, atol=1e-5)


def test_reference_key_names():
    keys = set(checkpoint.new("cmow", "tiny").model.state_dict())
    assert keys == {"transformer.embeddings.matrix_embedding.embedding.weight",
                    "transformer.embeddings.backward_matrix_embedding.embedding.weight",
                    "transformer.embeddings.vector_embedding.weight"}
