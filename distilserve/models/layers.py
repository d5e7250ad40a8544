"""The ALBERT building blocks that MiniALBERT and F-ALBERT share.

Both recursive families apply one ALBERT layer many times. Module and parameter names
follow Hugging Face's ALBERT (and so nlpie's MiniALBERT checkpoints):
``attention.{query,key,value,dense,LayerNorm}``, ``ffn``, ``ffn_output``,
``full_layer_layer_norm``; embeddings ``{word,position,token_type}_embeddings``,
``LayerNorm``. Everything here is TorchScript-scriptable so that the recursion can be
exported as a loop.

Shapes: B batch, T tokens, E embedding rank, D hidden, H heads, F intermediate (FFN).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The activations the families use, by their config names."""
    if kind == "gelu":  # exact (erf) GELU
        return F.gelu(x)
    if kind == "gelu_new" or kind == "gelu_pytorch_tanh" or kind == "gelu_fast":
        return F.gelu(x, approximate="tanh")
    if kind == "relu":
        return F.relu(x)
    raise ValueError("unsupported activation " + kind)


def lowest(dtype: torch.dtype) -> float:
    """The dtype's most negative finite value (``torch.finfo(dtype).min``, which
    TorchScript cannot call)."""
    if dtype == torch.float16:
        return -65504.0
    if dtype == torch.bfloat16:
        return -3.3895313892515355e38
    if dtype == torch.float64:
        return -1.7976931348623157e308
    return -3.4028234663852886e38


def attention_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, T] 1/0 mask -> [B, 1, 1, T] additive bias in the compute dtype: the dtype's
    lowest value at padding (as transformers does), so that softmax gives it 0 weight."""
    keep = attention_mask[:, None, None, :]
    return torch.zeros_like(keep, dtype=dtype).masked_fill(keep == 0, lowest(dtype))


class Embeddings(nn.Module):
    """Word + position + token-type embeddings of rank E, then LayerNorm: ids -> [B, T, E]."""

    def __init__(self, vocab_size: int, embedding_size: int, max_position_embeddings: int,
                 type_vocab_size: int, layer_norm_eps: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, embedding_size)
        self.position_embeddings = nn.Embedding(max_position_embeddings, embedding_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, embedding_size)
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        # positions 0 .. T-1 are the table's first T rows (no arange: a traced graph
        # would keep the device it was traced on)
        x = (self.word_embeddings(input_ids)  # [B, T, E]
             + self.position_embeddings.weight[: input_ids.shape[1]][None]  # [1, T, E]
             + self.token_type_embeddings(token_type_ids))  # [B, T, E]
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    """Post-LN multi-head self-attention block: x -> LayerNorm(x + dense(attn(x)))."""

    def __init__(self, hidden_size: int, num_heads: int, layer_norm_eps: float):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def attend(self, x: torch.Tensor, bias: torch.Tensor,
               with_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (LayerNorm(x + dense(context)) [B, T, D], attention probabilities
        [B, H, T, T] if ``with_probs`` (distillation) else an empty tensor).

        Without the probabilities, attention is ``scaled_dot_product_attention``, so that
        fused kernels (flash, memory-efficient) apply on the GPU and the CPU."""
        b, t, d = x.shape
        q = self.query(x).view(b, t, self.num_heads, self.head_size).transpose(1, 2)  # [B,H,T,d]
        k = self.key(x).view(b, t, self.num_heads, self.head_size).transpose(1, 2)
        v = self.value(x).view(b, t, self.num_heads, self.head_size).transpose(1, 2)
        if with_probs:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size) + bias  # [B,H,T,T]
            p = scores.softmax(-1)
            context = p @ v  # [B, H, T, d]
        else:
            p = torch.empty(0, dtype=x.dtype, device=x.device)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # [B, H, T, d]
        context = context.transpose(1, 2).reshape(b, t, d)  # [B, T, D]
        return self.LayerNorm(x + self.dense(context)), p

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.attend(x, bias)[0]


class AlbertLayer(nn.Module):
    """One ALBERT layer: attention, then the FFN ("transition module"), both post-LN.

    ``ffn_width`` uses only the first ``ffn_width`` intermediate units (F-ALBERT's
    partitioned FFN); None, all of them, is plain ALBERT. (None rather than the full
    width, so that an exported loop multiplies by the weights as they are stored, which
    ONNX Runtime prepacks and int8 quantisation finds, instead of slicing and transposing
    them again at every reuse.)
    """

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int,
                 hidden_act: str, layer_norm_eps: float):
        super().__init__()
        self.hidden_act = hidden_act
        self.attention = SelfAttention(hidden_size, num_heads, layer_norm_eps)
        self.ffn = nn.Linear(hidden_size, intermediate_size)
        self.ffn_output = nn.Linear(intermediate_size, hidden_size)
        self.full_layer_layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def mlp(self, x: torch.Tensor, ffn_width: int | None = None) -> torch.Tensor:
        """[B, T, D] -> [B, T, D] using intermediate units [:ffn_width] (None: all)."""
        w_in, b_in, w_out = self.ffn.weight, self.ffn.bias, self.ffn_output.weight
        if ffn_width is not None:  # F-ALBERT's partitioned FFN: its first units
            w_in, b_in, w_out = w_in[:ffn_width], b_in[:ffn_width], w_out[:, :ffn_width]
        h = activation(F.linear(x, w_in, b_in), self.hidden_act)  # [B, T, w]
        h = F.linear(h, w_out, self.ffn_output.bias)  # [B, T, D]
        return self.full_layer_layer_norm(x + h)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, ffn_width: int | None,
                with_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (output [B, T, D], attention probabilities [B, H, T, T] or empty)."""
        a, p = self.attention.attend(x, bias, with_probs)
        return self.mlp(a, ffn_width), p


class LayerGroup(nn.Module):
    """Holds the one shared layer under ALBERT's key name ``albert_layers.0``."""

    def __init__(self, layer: AlbertLayer):
        super().__init__()
        self.albert_layers = nn.ModuleList([layer])


class SharedLayerEncoder(nn.Module):
    """ALBERT's ``encoder``: ``albert_layer_groups.0.albert_layers.0`` is the shared layer."""

    def __init__(self, layer: AlbertLayer):
        super().__init__()
        self.albert_layer_groups = nn.ModuleList([LayerGroup(layer)])


class RecursiveEncoder(nn.Module):
    """What MiniALBERT and F-ALBERT share: embed, apply one layer L times, task output.
    Subclasses define ``embed``, ``iterate`` (reuse i: the new hidden states and, when
    asked, that reuse's attention probabilities) and ``output``; ``forward_iterations``
    takes the depth as an argument so that exports can keep it a loop with a run-time
    trip count. ``num_iterations`` (set by the subclass) is the configured depth."""

    def forward_iterations(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           token_type_ids: torch.Tensor, num_iterations: int) -> torch.Tensor:
        x = self.embed(input_ids, token_type_ids)  # [B, T, D]
        bias = attention_bias(attention_mask, x.dtype)  # [B, 1, 1, T]
        for i in range(num_iterations):
            x, _ = self.iterate(x, bias, i, False)
        return self.output(x, attention_mask)

    @torch.jit.unused
    def iterations(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(hidden [B, T, D], attention [B, H, T, T]) after every reuse, for distillation."""
        x = self.embed(input_ids, token_type_ids)
        bias = attention_bias(attention_mask, x.dtype)
        out = []
        for i in range(self.num_iterations):
            x, probs = self.iterate(x, bias, i, True)
            out.append((x, probs))
        return out

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.forward_iterations(input_ids, attention_mask, token_type_ids,
                                       self.num_iterations)
