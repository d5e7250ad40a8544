"""MiniALBERT ("MiniALBERT: Model Distillation via Parameter-Efficient Recursive
Transformers", Nouriborji et al., EACL 2023, arXiv:2210.06425): one shared ALBERT layer
applied L times, with optional per-iteration bottleneck adapters and a factorised
embedding.

    x_0 = projector(Embeddings(ids))                            [B, T, E] -> [B, T, D]
    O_i = f_mlp(phi_mlp^i(f_att(phi_att^i(O_{i-1}))))            i = 0 .. L-1
    phi(x) = LayerNorm(W_up gelu(W_down x) + x)                  (nlpie's code; the paper
                                                                   omits the LayerNorm)

The state dict uses nlpie's key names (their published checkpoints), so those load directly:
``albert.albert.embeddings.*``, ``albert.albert.encoder.albert_layer_groups.0.
albert_layers.0.*``, ``albert.projector``, ``albert.{att,mlp}_adapters.{i}.block.{0,2}``,
``albert.{att,mlp}_adapters.{i}.norm``, ``classifier``.

The adapters of all iterations are stored stacked ([L, ...] tensors) so that the loop
counter can index them: the loop can then stay a loop in TorchScript and ONNX.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from distilserve.models import heads
from distilserve.models.layers import AlbertLayer, Embeddings, RecursiveEncoder, SharedLayerEncoder


@dataclass
class MiniAlbertConfig:
    vocab_size: int = 30522
    embedding_size: int = 128  # the factorised rank r
    hidden_size: int = 768
    num_hidden_layers: int = 6  # how many times the shared layer is applied
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    use_adapter: bool = True
    reduction_factor: int = 16
    model_type: str = "minialbert"


PRESETS = {
    "minialbert-128": dict(embedding_size=128),
    "minialbert-312": dict(embedding_size=312),
    "minialbert-768": dict(embedding_size=768),
    "minialbert-768-noadapter": dict(embedding_size=768, use_adapter=False),
    # 384 wide with 12 heads, so that each iteration aligns with a MiniLM layer (distill)
    "student-384": dict(embedding_size=128, hidden_size=384, intermediate_size=1536),
    "tiny": dict(embedding_size=16, hidden_size=32, num_hidden_layers=3,
                 num_attention_heads=4, intermediate_size=64, reduction_factor=4,
                 max_position_embeddings=128),
}


class AdapterStack(nn.Module):
    """L bottleneck adapters, one per iteration, stored as [L, ...] tensors.

    Checkpoints hold them under nlpie's per-iteration names ``{i}.block.0`` (down),
    ``{i}.block.2`` (up), ``{i}.norm``: see ``MiniAlbert.checkpoint_state_dict``.
    """

    NAMES = {"down_weight": "block.0.weight", "down_bias": "block.0.bias",
             "up_weight": "block.2.weight", "up_bias": "block.2.bias",
             "norm_weight": "norm.weight", "norm_bias": "norm.bias"}

    __constants__ = ["hidden"]  # so that ONNX sees LayerNorm's shape as a constant

    def __init__(self, iterations: int, hidden: int, bottleneck: int, eps: float):
        super().__init__()
        self.iterations = iterations
        self.hidden = hidden
        self.eps = eps
        self.down_weight = nn.Parameter(torch.randn(iterations, bottleneck, hidden) * 0.02)
        self.down_bias = nn.Parameter(torch.zeros(iterations, bottleneck))
        self.up_weight = nn.Parameter(torch.randn(iterations, hidden, bottleneck) * 0.02)
        self.up_bias = nn.Parameter(torch.zeros(iterations, hidden))
        self.norm_weight = nn.Parameter(torch.ones(iterations, hidden))
        self.norm_bias = nn.Parameter(torch.zeros(iterations, hidden))

    def forward(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """[B, T, D] -> [B, T, D] with iteration i's adapter."""
        h = F.gelu(F.linear(x, self.down_weight[i], self.down_bias[i]))  # [B, T, D/r]
        h = F.linear(h, self.up_weight[i], self.up_bias[i]) + x  # [B, T, D]
        return F.layer_norm(h, [self.hidden], self.norm_weight[i], self.norm_bias[i], self.eps)


class NoAdapter(nn.Module):
    """The identity, for students without adapters (minialbert-768-noadapter)."""

    def forward(self, x: torch.Tensor, i: int) -> torch.Tensor:
        return x


class _AlbertCore(nn.Module):
    def __init__(self, c: MiniAlbertConfig):
        super().__init__()
        self.embeddings = Embeddings(c.vocab_size, c.embedding_size, c.max_position_embeddings,
                                     c.type_vocab_size, c.layer_norm_eps)
        self.encoder = SharedLayerEncoder(AlbertLayer(c.hidden_size, c.num_attention_heads,
                                            c.intermediate_size, c.hidden_act, c.layer_norm_eps))


class _Backbone(nn.Module):
    def __init__(self, c: MiniAlbertConfig):
        super().__init__()
        self.albert = _AlbertCore(c)
        self.projector = nn.Linear(c.embedding_size, c.hidden_size)
        bottleneck = c.hidden_size // c.reduction_factor
        adapter = (lambda: AdapterStack(c.num_hidden_layers, c.hidden_size, bottleneck,
                                        c.layer_norm_eps)) if c.use_adapter else NoAdapter
        self.att_adapters = adapter()
        self.mlp_adapters = adapter()


class MiniAlbert(RecursiveEncoder):
    """MiniALBERT with one task output (see distilserve/models/heads.py)."""

    def __init__(self, config: MiniAlbertConfig, task: str = "embed", num_labels: int = 0):
        super().__init__()
        self.config = config
        self.task = task
        self.pooling = "mean"  # an embedding: "none" returns the token vectors [B, T, D]
        self.num_iterations = config.num_hidden_layers
        self.albert = _Backbone(config)
        self.classifier = (nn.Linear(config.hidden_size, num_labels) if task != "embed"
                           else nn.Identity())

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> x_0 [B, T, D]."""
        return self.albert.projector(self.albert.albert.embeddings(input_ids, token_type_ids))

    def iterate(self, x: torch.Tensor, bias: torch.Tensor, i: int,
                with_probs: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """O_{i-1} [B, T, D] -> (O_i [B, T, D], attention [B, H, T, T] or empty)."""
        layer = self.albert.albert.encoder.albert_layer_groups[0].albert_layers[0]
        x, probs = layer.attention.attend(self.albert.att_adapters(x, i), bias, with_probs)
        x = self.albert.mlp_adapters(x, i)
        return layer.mlp(x), probs

    def output(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Final hidden [B, T, D] -> the task's output."""
        if self.task == "embed":
            return heads.pool(hidden, attention_mask, self.pooling)  # [B, D] (none: [B, T, D])
        if self.task == "classify":
            return self.classifier(hidden[:, 0])  # first token, no pooler: [B, C]
        return self.classifier(hidden)  # [B, T, C]

    @torch.jit.unused
    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict under nlpie's names: stacked adapters split per iteration."""
        state = self.state_dict()
        for kind in ("att_adapters", "mlp_adapters"):
            for ours, theirs in AdapterStack.NAMES.items():
                stacked = state.pop(f"albert.{kind}.{ours}", None)
                for i in range(0 if stacked is None else stacked.shape[0]):
                    state[f"albert.{kind}.{i}.{theirs}"] = stacked[i].clone()
        return state

    @torch.jit.unused
    def convert_checkpoint_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """nlpie's per-iteration adapter tensors -> the stacked ones. Incomplete sets are
        left as they are, for the strict load to name."""
        state = dict(state)
        for kind in ("att_adapters", "mlp_adapters"):
            for ours, theirs in AdapterStack.NAMES.items():
                keys = [f"albert.{kind}.{i}.{theirs}" for i in range(self.num_iterations)]
                if all(k in state for k in keys):
                    state[f"albert.{kind}.{ours}"] = torch.stack([state.pop(k) for k in keys])
        return state
