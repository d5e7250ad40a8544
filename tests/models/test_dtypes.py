"""Every family and task in fp16 and bf16 against fp32, on the CPU (torch runs both
there), so that dtype bugs show without a GPU; the same on CUDA in tests marked gpu."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distilserve.models import families
from distilserve.models.io import checkpoint
from distilserve.models.layers import attention_bias
from tests.conftest import FAMILIES, TASKS, batch

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")


def _rows(out: torch.Tensor, task: str, mask: torch.Tensor) -> torch.Tensor:
    """Outputs as rows to compare: one per text, or one per real token for NER."""
    return out[mask.bool()] if task == "ner" else out.flatten(1)


def _compare(family: str, task: str, dtype: str, device: str) -> None:
    model = checkpoint.new(family, "tiny", task).model.to(device)
    ids, mask, types = (t.to(device) for t in batch(3, 17))
    if task == "classify":
        types[0, 9:] = 1  # a text pair in the first row
    with torch.no_grad():
        ref = model(ids, mask, types)
        got = model.to(HALF[dtype])(ids, mask, types)
    assert got.dtype == HALF[dtype]  # computed in the dtype, not silently in fp32
    a, b = _rows(ref, task, mask), _rows(got.float(), task, mask)
    assert F.cosine_similarity(a, b, dim=-1).min() >= 0.999


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_half_precision_matches_fp32(family, task, dtype, device):
    if dtype not in families.get(family).dtypes:
        pytest.skip(f"{family} does not run in {dtype}")
    _compare(family, task, dtype, device)


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_question_answering_in_half_precision_matches_fp32(family, dtype):
    """The transformers families' QA heads: each token's start and end logits."""
    _compare(family, "qa", dtype, "cpu")


def test_cmow_leaves_out_fp16_because_its_products_overflow_it():
    """At the paper's size, products of 200 matrices pass fp16's largest number."""
    assert families.get("cmow").dtypes == ("fp32", "bf16")
    model = checkpoint.new("cmow", "cmow-hybrid-bidi").model
    ids, mask, types = batch(1, 200, pad_row=None)
    with torch.no_grad():
        ref = model(ids, mask, types)
        assert ref.abs().max() > torch.finfo(torch.float16).max
        assert not torch.isfinite(model.half()(ids, mask, types)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_attention_bias_is_in_the_compute_dtype(dtype):
    mask = torch.tensor([[1, 1, 0]])
    bias = attention_bias(mask, dtype)
    assert bias.dtype == dtype and bias.shape == (1, 1, 1, 3)
    assert bias[0, 0, 0, :2].eq(0).all() and bias[0, 0, 0, 2] == torch.finfo(dtype).min


@pytest.mark.parametrize("family", [f for f in FAMILIES if "fp16" in families.get(f).dtypes])
def test_the_exports_fp16_linears_in_fp32_are_torchs_fp16(family):
    """The export's fp16 check computes linear layers in fp32 from their fp16 values: the
    numbers torch's own fp16 GEMM gives (sums in fp32: fp16 sums of 0.1 would stop at 256,
    these reach 20000; the result rounded to fp16), every other op in fp16, and a model's
    outputs within two fp16 steps of torch's own."""
    from distilserve.models.export.parity import Fp16LinearsInFp32

    x, w = torch.full((2, 200000), 0.1).half(), torch.ones(3, 200000).half()
    with Fp16LinearsInFp32():
        summed = F.linear(x, w)
        assert summed.dtype == torch.float16 and torch.add(x, x).dtype == torch.float16
    assert summed.eq(F.linear(x, w)).all() and summed.eq(20000).all()
    model = checkpoint.new(family, "tiny", "embed").model.half()
    ids, mask, types = batch(3, 17)
    with torch.no_grad():
        native = model(ids, mask, types)
        with Fp16LinearsInFp32():
            emulated = model(ids, mask, types)
    assert emulated.dtype == torch.float16
    assert torch.allclose(emulated.float(), native.float(), rtol=0, atol=4e-3)
