"""distilserve/models/layers.py, the parts the recursive families share, against plain formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from distilserve.models.layers import AlbertLayer, SelfAttention, activation, attention_bias, lowest


def test_attention_bias_blocks_padding_in_every_dtype():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        bias = attention_bias(mask, dtype)
        assert bias.shape == (2, 1, 1, 3) and bias.dtype == dtype
        assert bias[0, 0, 0, :2].eq(0).all() and bias[1, 0, 0, 1:].eq(lowest(dtype)).all()
        assert lowest(dtype) == torch.finfo(dtype).min  # the TorchScript-able twin
        probs = (torch.zeros(2, 1, 1, 3, dtype=dtype) + bias).float().softmax(-1)
        assert probs[1, 0, 0].tolist() == [1.0, 0.0, 0.0]  # padding gets no weight


def test_activations_by_config_name():
    x = torch.linspace(-3, 3, 13)
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    assert torch.allclose(activation(x, "gelu"), exact, atol=1e-6)
    assert torch.allclose(activation(x, "gelu_new"), F.gelu(x, approximate="tanh"))
    assert torch.equal(activation(x, "relu"), x.clamp(min=0))
    with pytest.raises(ValueError, match="unsupported activation swish"):
        activation(x, "swish")


def _attention():
    torch.manual_seed(0)
    return SelfAttention(hidden_size=16, num_heads=4, layer_norm_eps=1e-12).eval()


def test_fused_attention_equals_the_written_out_formula_and_its_probabilities():
    layer = _attention()
    x = torch.randn(2, 5, 16)
    bias = attention_bias(torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), x.dtype)
    with torch.no_grad():
        fused, none = layer.attend(x, bias)
        written, probs = layer.attend(x, bias, with_probs=True)
        # by hand: softmax(q k^T / sqrt(d) + bias) v, heads merged, dense, residual, LN
        q, k, v = (m(x).view(2, 5, 4, 4).transpose(1, 2)
                   for m in (layer.query, layer.key, layer.value))
        p = (q @ k.transpose(-1, -2) / 2.0 + bias).softmax(-1)
        context = (p @ v).transpose(1, 2).reshape(2, 5, 16)
        expected = layer.LayerNorm(x + layer.dense(context))
    assert none.numel() == 0 and probs.shape == (2, 4, 5, 5)
    assert torch.allclose(fused, expected, atol=1e-5) and torch.allclose(written, expected,
                                                                         atol=1e-5)
    assert torch.allclose(probs, p, atol=1e-6) and probs[1, :, :, 3:].abs().max() == 0


def test_padding_does_not_change_the_real_tokens():
    layer = _attention()
    x = torch.randn(1, 3, 16)
    padded = torch.cat([x, torch.randn(1, 2, 16)], dim=1)
    with torch.no_grad():
        alone = layer(x, attention_bias(torch.ones(1, 3), x.dtype))
        beside = layer(padded, attention_bias(torch.tensor([[1, 1, 1, 0, 0]]), x.dtype))
    assert torch.allclose(alone, beside[:, :3], atol=1e-5)


def test_a_partitioned_ffn_uses_only_its_first_units():
    torch.manual_seed(0)
    layer = AlbertLayer(16, 4, 32, "gelu", 1e-12).eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        full = layer.mlp(x, 32)
        half = layer.mlp(x, 16)
        layer.ffn.weight[16:] += 1.0  # the units past the width
        assert torch.equal(layer.mlp(x, 16), half) and not torch.equal(layer.mlp(x, 32), full)
