"""F-ALBERT ("F-ALBERT: A Distilled Model from a Two-Time Distillation System for Reduced
Computational Complexity in ALBERT Model", Kim and Jeong, Applied Sciences 2023,
doi:10.3390/app13179530): ALBERT with fewer reuses (LR-ALBERT), then a shrinking FFN.

    x_0 = embedding_hidden_mapping_in(Embeddings(ids))            [B, T, E] -> [B, T, D]
    O_i = AlbertLayer(O_{i-1}, ffn_width = C_i * F / N)            i = 0 .. L-1

The FFN ("transition module") is split into N = ``ffn_partitions`` equal parts along the
intermediate dimension; reuse i uses only the first C_i parts (``connection_schedule``,
non-increasing). With every C_i = N this is plain ALBERT, and the key names are Hugging
Face ALBERT's, so an ALBERT checkpoint loads as an LR-ALBERT with fewer reuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from distilserve.models import heads
from distilserve.models.layers import AlbertLayer, Embeddings, RecursiveEncoder, SharedLayerEncoder


@dataclass
class FAlbertConfig:
    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 768
    num_hidden_layers: int = 12  # reuses of the shared layer
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu_new"
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    ffn_partitions: int = 4
    connection_schedule: list[int] = field(default_factory=list)  # C_i; empty = all N
    model_type: str = "falbert"

    def __post_init__(self):
        n, schedule = self.ffn_partitions, self.connection_schedule
        if not schedule:
            self.connection_schedule = schedule = [n] * self.num_hidden_layers
        if self.intermediate_size % n:
            raise ValueError(f"intermediate_size {self.intermediate_size} is not divisible "
                             f"into ffn_partitions={n} parts")
        if len(schedule) != self.num_hidden_layers:
            raise ValueError(f"connection_schedule has {len(schedule)} entries for "
                             f"{self.num_hidden_layers} reuses")
        if any(not 1 <= c <= n for c in schedule) or schedule != sorted(schedule, reverse=True):
            raise ValueError(f"connection_schedule {schedule} must be non-increasing, "
                             f"each between 1 and ffn_partitions={n}")

    @property
    def ffn_widths(self) -> list[int]:
        """Intermediate units used at each reuse: C_i * F / N."""
        k = self.intermediate_size // self.ffn_partitions
        return [c * k for c in self.connection_schedule]


_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
              intermediate_size=4096)
PRESETS = {
    "albert-base": dict(),
    "lr-albert": dict(num_hidden_layers=6),
    "falbert": dict(num_hidden_layers=6, connection_schedule=[4, 4, 3, 3, 2, 2]),
    # ALBERT-large (1024 wide, 24 reuses), its half-reuse student, and that student with
    # the base schedule's three steps (all parts, one fewer, two fewer) stretched to 12
    "albert-large": dict(_LARGE),
    "lr-albert-large": dict(_LARGE, num_hidden_layers=12),
    "falbert-large": dict(_LARGE, num_hidden_layers=12,
                          connection_schedule=[4] * 4 + [3] * 4 + [2] * 4),
    # 384 wide with 12 heads, so that each reuse aligns with a MiniLM layer (distill)
    "student-384": dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6,
                        connection_schedule=[4, 4, 3, 3, 2, 2]),
    "tiny": dict(embedding_size=16, hidden_size=32, num_hidden_layers=4,
                 num_attention_heads=4, intermediate_size=64,
                 connection_schedule=[4, 4, 3, 2], max_position_embeddings=128),
}


class _Encoder(SharedLayerEncoder):
    def __init__(self, c: FAlbertConfig):
        super().__init__(AlbertLayer(c.hidden_size, c.num_attention_heads, c.intermediate_size,
                                     c.hidden_act, c.layer_norm_eps))
        self.embedding_hidden_mapping_in = nn.Linear(c.embedding_size, c.hidden_size)


class _Albert(nn.Module):
    def __init__(self, c: FAlbertConfig, pooler: bool):
        super().__init__()
        self.embeddings = Embeddings(c.vocab_size, c.embedding_size, c.max_position_embeddings,
                                     c.type_vocab_size, c.layer_norm_eps)
        self.encoder = _Encoder(c)
        # ALBERT's pooler (tanh of a dense layer on the first token) feeds the classifier;
        # AlbertModel has it too (embed), AlbertForTokenClassification does not (ner).
        self.pooler = nn.Linear(c.hidden_size, c.hidden_size) if pooler else nn.Identity()


class FAlbert(RecursiveEncoder):
    """ALBERT / LR-ALBERT / F-ALBERT with one task output (see distilserve/models/heads.py)."""

    __constants__ = ["whole_ffn"]  # a constant of a scripted loop

    def __init__(self, config: FAlbertConfig, task: str = "embed", num_labels: int = 0):
        super().__init__()
        self.config = config
        self.task = task
        self.pooling = "mean"  # an embedding: "none" returns the token vectors [B, T, D]
        self.num_iterations = config.num_hidden_layers
        self.ffn_widths = config.ffn_widths
        # every reuse with the whole FFN (ALBERT, LR-ALBERT): not sliced (AlbertLayer)
        self.whole_ffn = all(w == config.intermediate_size for w in self.ffn_widths)
        self.albert = _Albert(config, pooler=task != "ner")
        self.classifier = (nn.Linear(config.hidden_size, num_labels) if task != "embed"
                           else nn.Identity())

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> x_0 [B, T, D]."""
        x = self.albert.embeddings(input_ids, token_type_ids)  # [B, T, E]
        return self.albert.encoder.embedding_hidden_mapping_in(x)

    def iterate(self, x: torch.Tensor, bias: torch.Tensor, i: int,
                with_probs: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """O_{i-1} [B, T, D] -> (O_i [B, T, D], attention or empty), FFN cut to reuse i's
        width."""
        layer = self.albert.encoder.albert_layer_groups[0].albert_layers[0]
        return layer(x, bias, None if self.whole_ffn else self.ffn_widths[i], with_probs)

    def output(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.task == "embed":
            return heads.pool(hidden, attention_mask, self.pooling)  # [B, D] (none: [B, T, D])
        if self.task == "classify":
            return self.classifier(torch.tanh(self.albert.pooler(hidden[:, 0])))  # [B, C]
        return self.classifier(hidden)  # [B, T, C]

    def ffn_flops_per_token(self) -> int:
        """Multiply-adds x 2 of the FFN over all reuses, per token (the part F-ALBERT cuts)."""
        return sum(2 * 2 * self.config.hidden_size * w for w in self.ffn_widths)

    @torch.jit.unused
    def convert_checkpoint_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A Hugging Face AlbertModel saves its tensors without the "albert." prefix that
        AlbertFor* models (and this one) have."""
        if any(k.startswith("albert.") for k in state):
            return state
        return {"albert." + k: v for k, v in state.items()}
