import base64
import sys

import numpy as np
import pytest

from distilserve.server.core import postprocess, tokenisation


def classification(logits, labels, top_k, multi_label=False, function=None):
    """One input's labels and scores as the classify routes answer them."""
    return postprocess.best(postprocess.label_scores(logits, labels, multi_label, function),
                            labels, top_k)


def test_classification_is_sorted_probabilities_with_top_k():
    res = classification(np.array([0.1, 2.0, -1.0]), ["a", "b", "c"], None)
    assert [r["label"] for r in res] == ["b", "a", "c"]
    assert abs(sum(r["score"] for r in res) - 1) < 1e-6
    assert classification(np.array([0.1, 2.0, -1.0]), ["a", "b", "c"], 1) == res[:1]
    single = classification(np.array([0.0]), ["yes"], None)
    assert single == [{"label": "yes", "score": 0.5}]  # one label: a sigmoid
    independent = classification(np.array([0.0, 2.0]), ["a", "b"], None, True)
    assert [r["score"] for r in independent] == pytest.approx([0.8808, 0.5], abs=1e-4)
    # raw: the logits themselves, in the same order, for every kind of head
    for logits, labels, multi in (([0.1, 2.0, -1.0], ["a", "b", "c"], False),
                                  ([-3.0], ["yes"], False), ([0.0, 2.0], ["a", "b"], True)):
        cooked = classification(np.array(logits), labels, None, multi)
        raw = classification(np.array(logits), labels, None, multi, "none")
        assert [r["label"] for r in raw] == [r["label"] for r in cooked]
        assert sorted(r["score"] for r in raw) == sorted(logits)
    # a function asked for, whatever the head
    assert [r["score"] for r in classification(
        np.array([0.0, 2.0]), ["a", "b"], None, False, "sigmoid")] == pytest.approx(
        [0.8808, 0.5], abs=1e-4)
    assert [r["score"] for r in classification(
        np.array([0.0, 2.0]), ["a", "b"], None, True, "softmax")] == pytest.approx(
        [0.8808, 0.1192], abs=1e-4)


def test_label_scores_of_a_batch_are_each_rows_and_best_keeps_ties_in_label_order():
    """The model's thread scores a classifier's batch [B, L] at once (the engine's
    batch_postprocess): each row as its input alone would be scored."""
    logits = np.array([[0.1, 2.0, -1.0], [3.0, 3.0, -50.0], [-90.0, 0.0, 90.0]], np.float32)
    for multi in (False, True):
        batch = postprocess.label_scores(logits, ["a", "b", "c"], multi)
        for row, scores in zip(logits, batch):
            np.testing.assert_allclose(scores, postprocess.label_scores(row, ["a", "b", "c"],
                                                                        multi), rtol=1e-6)
    tied = postprocess.best(np.array([0.25, 0.5, 0.25], np.float32), ["a", "b", "c"], None)
    assert tied == [{"label": "b", "score": 0.5}, {"label": "a", "score": 0.25},
                    {"label": "c", "score": 0.25}]
    assert all(type(r["score"]) is float for r in tied)


def test_zero_shot_scores_as_the_pipeline_takes_an_nli_models_logits():
    # [L, C]: three candidate labels, an NLI model's (entailment, neutral, contradiction)
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.0, 0.5], [-1.0, 0.0, 3.0]])
    against = postprocess.zero_shot(logits, entailment=0, independent=False)
    np.testing.assert_allclose(against, postprocess.softmax(logits[:, 0]))
    assert against.sum() == pytest.approx(1)
    # each on its own: entailment against contradiction (the last label, entailment first)
    alone = postprocess.zero_shot(logits, entailment=0, independent=True)
    np.testing.assert_allclose(alone, 1 / (1 + np.exp(logits[:, 2] - logits[:, 0])))
    # entailment elsewhere: contradiction is the first label, as transformers takes it
    second = postprocess.zero_shot(logits, entailment=1, independent=True)
    np.testing.assert_allclose(second, 1 / (1 + np.exp(logits[:, 0] - logits[:, 1])))
    # one label is scored on its own whatever is asked; raw: the entailment logits
    np.testing.assert_allclose(postprocess.zero_shot(logits[:1], 0, False), alone[:1])
    np.testing.assert_array_equal(postprocess.zero_shot(logits, 1, False, raw=True),
                                  logits[:, 1])
    assert postprocess.best(against, ["a", "b", "c"], 2) == [
        {"label": "a", "score": pytest.approx(against[0])},
        {"label": "b", "score": pytest.approx(against[1])}]


def test_answers_are_the_contexts_best_spans_as_the_pipeline_finds_them():
    from tokenizers import Tokenizer

    from distilserve.models.io import checkpoint

    tokenizer = Tokenizer.from_file(str(checkpoint.default_tokenizer_dir() / "tokenizer.json"))
    context = "Bananas grow in Ecuador."
    encoding = tokenizer.encode("Where?", context)
    tokens = encoding.tokens  # [CLS] where ? [SEP] bananas grow in ecuador . [SEP]
    at = tokens.index("ecuador")
    logits = np.full((len(tokens), 2), -5.0)
    logits[at] = [4.0, 4.0]  # Ecuador, alone
    logits[1] = [9.0, 9.0]  # the question's: never an answer
    logits[0] = [3.0, 3.0]  # [CLS]: no answer
    (best,) = postprocess.answers([(logits, encoding)], context, 101, 1, 15, False, True)
    assert (best["answer"], best["start"], best["end"]) == ("Ecuador", 16, 23)
    found = postprocess.answers([(logits, encoding)], context, 101, 3, 15, True, True)
    assert found[0]["answer"] == "Ecuador" and "" in [a["answer"] for a in found]
    empty = next(a for a in found if a["answer"] == "")
    assert (empty["start"], empty["end"]) == (0, 0) and 0 < empty["score"] < best["score"]
    # a span no longer than max_answer_len tokens: "grow in Ecuador" is three
    logits[tokens.index("grow")] = [6.0, -5.0]
    longest = postprocess.answers([(logits, encoding)], context, 101, 1, 3, False, True)[0]
    assert longest["answer"] == "grow in Ecuador"
    shorter = postprocess.answers([(logits, encoding)], context, 101, 1, 2, False, True)[0]
    assert shorter["answer"] == "Ecuador"
    # windows: the best of each, the same text's scores summed, the least no-answer score
    other = np.full_like(logits, -5.0)
    other[at] = [4.0, 4.0]
    other[0] = [8.0, 8.0]  # this window says "no answer" more strongly: the other counts
    both = postprocess.answers([(logits, encoding), (other, encoding)], context, 101, 50,
                               15, True, True)
    alone = postprocess.answers([(logits, encoding)], context, 101, 50, 15, True, True)
    scores = {a["answer"]: a["score"] for a in both}
    assert scores["Ecuador"] > {a["answer"]: a["score"] for a in alone}["Ecuador"]
    assert scores[""] == {a["answer"]: a["score"] for a in alone}[""]


def test_base64_is_little_endian_float32():
    v = np.array([1.5, -2.0, 0.25])
    raw = base64.b64decode(postprocess.embedding_payload(v, "base64"))
    assert np.frombuffer(raw, "<f4").tolist() == [1.5, -2.0, 0.25]
    floats = postprocess.embedding_payload(v, "float")
    assert floats.dtype == np.float32 and floats.tolist() == [1.5, -2.0, 0.25]


# vLLM's embed_dtype: torch's dtype its numbers are converted to, and a view of their bits
TORCH_DTYPES = {"float32": ("float32", "int32"), "float16": ("float16", "int16"),
                "bfloat16": ("bfloat16", "int16"), "fp8_e4m3": ("float8_e4m3fn", "uint8"),
                "fp8_e5m2": ("float8_e5m2", "uint8")}


@pytest.mark.parametrize("dtype", sorted(TORCH_DTYPES))
def test_packed_numbers_are_torchs_conversion_in_either_byte_order(dtype):
    """vLLM packs an output's numbers with torch's conversion (round to the nearest), row
    after row: the same bytes here, little- and big-endian."""
    torch = pytest.importorskip("torch")
    v = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    to, bits = (getattr(torch, name) for name in TORCH_DTYPES[dtype])
    little = torch.from_numpy(v).to(to).flatten().view(bits).numpy().astype(
        f"<{'u' if bits == torch.uint8 else 'i'}{to.itemsize}")
    assert postprocess.packed(v, dtype) == little.tobytes()
    assert postprocess.packed(v, dtype, "big") == little.astype(little.dtype.newbyteorder(
        ">")).tobytes()
    assert postprocess.packed(v, dtype, "native") == postprocess.packed(v, dtype, sys.byteorder)


def test_packed_outputs_say_where_each_lies():
    outputs = [np.ones(3), np.zeros((2, 2)), np.full(1, -1.0)]
    body, where = postprocess.packed_outputs(outputs, "float16", "little")
    assert [(w["start"], w["end"], w["shape"]) for w in where] == [
        (0, 6, [3]), (6, 14, [2, 2]), (14, 16, [1])]
    assert all((w["embed_dtype"], w["endianness"]) == ("float16", "little") for w in where)
    for w, output in zip(where, outputs):
        got = np.frombuffer(body[w["start"]:w["end"]], "<f2").reshape(w["shape"])
        assert np.array_equal(got, output)
    assert base64.b64decode(postprocess.embedding_payload(outputs[1], "base64", "float16")) \
        == body[6:14]


def test_normalize_rows_each_to_unit_length_and_leaves_zeros():
    rows = np.array([[3.0, 4.0], [0.0, 0.0], [0.0, -2.0]], dtype=np.float32)
    out = postprocess.normalize(rows)
    assert np.allclose(out, [[0.6, 0.8], [0.0, 0.0], [0.0, -1.0]])
    assert np.allclose(postprocess.normalize(rows[0]), [0.6, 0.8])


def test_normalize_keeps_vectors_whose_squares_overflow_float32():
    """CMOW's products on long inputs (1e23 at 400 words): the vector came back as zeros."""
    v = np.random.default_rng(0).normal(size=(2, 1200)).astype(np.float32)
    v /= np.abs(v).max()
    for scale in (1e18, 1e23, 1e36, 3e38):  # 3e38: its length too is past float32
        out = postprocess.normalize(v * np.float32(scale))
        assert out.dtype == np.float32
        assert np.allclose(out, postprocess.normalize(v), atol=1e-6)


def test_sentence_embeddings_pool_token_vectors_as_the_graphs_do():
    import torch

    from distilserve.models import heads
    from distilserve.models.tasks import POOLINGS

    g = np.random.default_rng(0)
    hidden = g.normal(size=(2, 5, 3)).astype(np.float32)  # [B, T, D]
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    tokens = [hidden[0], hidden[1, :2]]  # as the engine gives them: padding left out
    for how in POOLINGS:
        want = heads.pool(torch.from_numpy(hidden), torch.from_numpy(mask), how).numpy()
        assert np.abs(postprocess.sentence_embeddings(tokens, how) - want).max() < 1e-6
    pooled = [hidden[0, 0], hidden[1, 0]]  # an export that pools: as they are
    assert np.array_equal(postprocess.sentence_embeddings(pooled, None), hidden[:, 0])
    with pytest.raises(ValueError, match="unknown pooling 'lasttoken'"):
        postprocess.sentence_embeddings(tokens, "lasttoken")


def test_a_batchs_masks_are_decoded_in_one_product_and_given_back_per_input():
    """Two inputs of a batch [2, 4], with 1 and 2 masks (id 4) and one with none: each gets
    the logits of its own masks, in order (weight [V=5, E=3], bias [V])."""
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((5, 3)), rng.standard_normal(5)
    vectors = rng.standard_normal((3, 4, 3)).astype(np.float32)  # [B, T, E]
    ids = np.array([[0, 4, 2, 3], [0, 2, 2, 3], [4, 1, 4, 3]])
    first, none, third = postprocess.decode_masks(ids, vectors, 4,
                                                  lambda x: x @ weight.T + bias)
    np.testing.assert_allclose(first, vectors[0, [1]] @ weight.T + bias, rtol=1e-6)
    assert none.shape == (0, 5)
    np.testing.assert_allclose(third, vectors[2, [0, 2]] @ weight.T + bias, rtol=1e-6)


def test_fill_mask_scores_each_mask_over_the_vocabulary():
    """A vocabulary of 5 (4 is the mask), each mask's logits given."""
    logits = np.array([[0, 3, 1, 0, 0], [2, 0, 0, 5, 0]], dtype=np.float32)  # [M, V]
    ids = [0, 4, 2, 4]

    def decode(tokens, skip):
        return " ".join(f"t{t}" for t in tokens if not (skip and t == 4)) + ("!" if skip else "")

    first, second = postprocess.fill_mask(logits, ids, 4, 2, None, decode)
    expected = postprocess.softmax(logits[0])
    assert [t["token"] for t in first] == [1, 2]
    np.testing.assert_allclose([t["score"] for t in first], expected[[1, 2]], rtol=1e-6)
    # several masks: each sequence fills its own and keeps the other (special tokens shown)
    assert first[0]["sequence"] == "t0 t1 t2 t4" and second[0]["sequence"] == "t0 t4 t2 t3"
    assert first[0]["token_str"] == "t1"
    (only,) = postprocess.fill_mask(logits[:1], ids[:2], 4, 5, [0, 2], decode)
    assert [t["token"] for t in only] == [2, 0]  # the targets alone, top_k capped to them
    # probabilities over the whole vocabulary, not renormalised over the targets
    np.testing.assert_allclose(only[0]["score"], expected[2], rtol=1e-6)
    assert only[0]["sequence"] == "t0 t2!"  # one mask: special tokens left out


@pytest.mark.parametrize("k", [1, 2, 3, 6, 9])
def test_largest_gives_what_a_stable_sort_gives(k):
    """The k largest, largest first, ties in index order, as the first k of a stable sort
    of all: with ties inside, across and below the k-th place."""
    x = np.array([1.0, 5.0, 3.0, 5.0, 3.0, 0.0, 3.0, -1.0])
    assert postprocess.largest(x, k).tolist() == np.argsort(-x, kind="stable")[:k].tolist()
    rng = np.random.default_rng(k)
    y = rng.integers(0, 20, 1000).astype(np.float32)  # many ties
    assert postprocess.largest(y, k).tolist() == np.argsort(-y, kind="stable")[:k].tolist()


@pytest.mark.parametrize("text", [
    "the cat , the dog . and you ?", "she didn ' t ! we ' re , i ' m he ' s they ' ve",
    "a ' b ' c", "no clean up here", " . , ! ?", "it ' s  ,", ""])
def test_clean_up_tokenization_is_transformers(text):
    from transformers import PreTrainedTokenizerFast

    assert tokenisation.clean_up_tokenization(text) == \
        PreTrainedTokenizerFast.clean_up_tokenization(text)


def test_the_sigmoid_of_any_logit_without_a_warning():
    """1 / (1 + e^-x) overflowed (numpy's RuntimeWarning) for logits far below 0; the values
    are the same, the tiny ones kept, in the logits' dtype."""
    logits = np.array([-1000, -30, -2, 0, 2, 30, 1000], dtype=np.float32)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        scores = postprocess.sigmoid(logits)
    assert scores.dtype == np.float32
    expected = [0.0, 9.357623e-14, 0.11920292, 0.5, 0.88079708, 1.0, 1.0]
    np.testing.assert_allclose(scores, expected, rtol=1e-6)


def test_cohere_embedding_types_as_cohere_defines_them():
    import base64

    from distilserve.server.core.postprocess import cohere_embeddings

    v = np.array([[0.6, -0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.01]], dtype=np.float32)
    got = cohere_embeddings(v, ["int8", "uint8", "binary", "ubinary", "base64", "int8"])
    assert list(got) == ["int8", "uint8", "binary", "ubinary", "base64"]  # once each
    assert got["int8"].tolist() == [[76, -102, 0, 0, 0, 0, 0, 0, 1]]
    assert got["uint8"].tolist() == [[204, 25, 128, 128, 128, 128, 128, 128, 129]]
    assert got["ubinary"].tolist() == [[0b10000000, 0b10000000]]  # 9 bits: two bytes
    assert got["binary"].tolist() == [[0, 0]]
    assert np.array_equal(np.frombuffer(base64.b64decode(got["base64"][0]), "<f4"), v[0])
