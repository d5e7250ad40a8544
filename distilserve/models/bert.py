"""The fully parameterised students (BERT, DistilBERT, TinyBERT, MiniLM, MobileBERT, and
ALBERT checkpoints) through transformers' own classes, plus the key converter for the
academic-budget-bert students of "How to Distill your BERT: An Empirical Study on the
Impact of Weight Initialisation and Distillation Objectives" (Wang et al., ACL 2023,
arXiv:2305.15032).

Checkpoints are ordinary Hugging Face folders, so transformers' pipelines load them too.
"""

from __future__ import annotations

import inspect
import re

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)
from transformers.models.albert import modeling_albert
from transformers.models.bert import modeling_bert
from transformers.models.distilbert import modeling_distilbert

from distilserve.models import heads, layers
from distilserve.models.tasks import LABELLED

PRESETS = {
    "bert": {
        "bert-base": dict(model_type="bert"),
        "tinybert-4l": dict(model_type="bert", hidden_size=312, num_hidden_layers=4,
                            num_attention_heads=12, intermediate_size=1200),
        "minilm-l6": dict(model_type="bert", hidden_size=384, num_hidden_layers=6,
                          num_attention_heads=12, intermediate_size=1536),
        "mobilebert": dict(model_type="mobilebert"),
        "tiny": dict(model_type="bert", hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=128),
    },
    "distilbert": {
        "distilbert": dict(model_type="distilbert"),
        "tiny": dict(model_type="distilbert", dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                     max_position_embeddings=128),
    },
}

_AUTO = {"embed": AutoModel, "classify": AutoModelForSequenceClassification,
         "ner": AutoModelForTokenClassification, "qa": AutoModelForQuestionAnswering,
         "fill-mask": AutoModelForMaskedLM}

# a masked-language model's head up to its decoder (the projection onto the vocabulary,
# get_output_embeddings()), by model type: hidden states [B, T, D] -> [B, T, E] (E: D, or
# ALBERT's embedding size)
MLM_TRANSFORMS = {
    "bert": lambda m, h: m.cls.predictions.transform(h),
    "distilbert": lambda m, h: m.vocab_layer_norm(m.activation(m.vocab_transform(h))),
    "albert": lambda m, h: m.predictions.LayerNorm(m.predictions.activation(
        m.predictions.dense(h))),
}


def _sdpa_mask(mask: torch.Tensor, dtype: torch.dtype, tgt_len: int | None = None) -> torch.Tensor:
    """Stands in for transformers' ``_prepare_4d_attention_mask_for_sdpa`` in its BERT,
    DistilBERT and ALBERT modules: the same additive mask ([B, T] 1/0 -> [B, 1, 1, T], the
    dtype's lowest value at padding; broadcast over the queries rather than expanded to
    [B, 1, T, T]), without its shortcut of no mask for a batch with no padding, which it
    takes after reading ``torch.all(mask == 1)`` on the host. On a GPU that read waits for
    every kernel queued before it (a batch could not be launched while the one before it
    ran) and cannot be recorded in a CUDA graph; a traced model never took it. MobileBERT
    builds its mask without such a read."""
    return layers.attention_bias(mask, dtype)


for _module in (modeling_bert, modeling_distilbert, modeling_albert):
    assert hasattr(_module, "_prepare_4d_attention_mask_for_sdpa"), _module.__name__
    _module._prepare_4d_attention_mask_for_sdpa = _sdpa_mask
del _module


class HFEncoder(nn.Module):
    """A transformers model with the families' common forward and one task output:
    (input_ids, attention_mask, token_type_ids) [B, T] -> embed [B, D] (pooled: mean or
    cls; then a sentence-transformers Dense module's [B, D'] where it has one; SPLADE's
    [B, V] from a masked-language model), classify logits [B, C], ner logits [B, T, C],
    qa's start and end logits [B, T, 2], or fill-mask's vectors before the language-model
    head's decoder [B, T, E] (``decoder()``: its weight and bias)."""

    def __init__(self, model: nn.Module, task: str, pooling: str = "mean"):
        super().__init__()
        self.model = model
        self.task = task
        self.pooling = pooling
        self.dense: nn.Module = nn.Identity()  # checkpoint.load sets a heads.Dense
        self.config = model.config
        self.uses_token_types = "token_type_ids" in inspect.signature(model.forward).parameters

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.uses_token_types:
            inputs["token_type_ids"] = token_type_ids
        if self.task == "fill-mask":  # the head's decoder runs in the service (mask tokens)
            hidden = self.model.base_model(**inputs).last_hidden_state  # [B, T, D]
            return MLM_TRANSFORMS[self.config.model_type](self.model, hidden)  # [B, T, E]
        out = self.model(**inputs)
        if self.task == "qa":
            return torch.stack([out.start_logits, out.end_logits], -1)  # [B, T, 2]
        if self.task != "embed":
            return out.logits
        if self.pooling == "splade":
            return heads.splade(out.logits, attention_mask)  # [B, V]
        return self.dense(heads.pool(out.last_hidden_state, attention_mask, self.pooling))


def decoder(model: HFEncoder) -> dict[str, torch.Tensor]:
    """A fill-mask model's decoder: ``weight`` [V, E] and ``bias`` [V], logits = x W^T + b."""
    linear = model.model.get_output_embeddings()
    return {"weight": linear.weight.detach(), "bias": linear.bias.detach()}


def hf_config(config: dict) -> PretrainedConfig:
    fields = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(config["model_type"], **fields)


def build(config: dict, task: str, labels: list[str], pooling: str = "mean") -> HFEncoder:
    """A model with fresh weights from a config.json dict."""
    cfg = hf_config(config)
    if task == "fill-mask" and cfg.model_type not in MLM_TRANSFORMS:
        raise ValueError(f"fill-mask is served for {', '.join(MLM_TRANSFORMS)} models, not "
                         f"{cfg.model_type}")
    if task in LABELLED:
        cfg.id2label = dict(enumerate(labels))
        cfg.label2id = {label: i for i, label in enumerate(labels)}
    torch.manual_seed(0)
    auto = AutoModelForMaskedLM if pooling == "splade" else _AUTO[task]
    return HFEncoder(auto.from_config(cfg), task, pooling)


def normalise_keys(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Adds or strips the base-model prefix (``bert.`` ...), as transformers does, so that
    a base checkpoint loads under a task model and the other way round."""
    prefix = model.base_model_prefix + "."
    if model.base_model is model:
        return {k.removeprefix(prefix): v for k, v in state.items()}
    if not any(k.startswith(prefix) for k in state):
        return {prefix + k: v for k, v in state.items()}
    return state


# "How to Distill your BERT" students are saved with academic-budget-bert's names.
_ACADEMIC_BUDGET_BERT = [
    (re.compile(r"\.PreAttentionLayerNorm\."), ".attention.output.LayerNorm."),
    (re.compile(r"\.PostAttentionLayerNorm\."), ".output.LayerNorm."),
    (re.compile(r"\.intermediate\.dense_act\.dense\."), ".intermediate.dense."),
    (re.compile(r"\.intermediate\.dense_act\.(weight|bias)$"), r".intermediate.dense.\1"),
]


def is_academic_budget_bert(state: dict) -> bool:
    return any("PreAttentionLayerNorm" in k or "dense_act" in k for k in state)


def convert_academic_budget_bert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """academic-budget-bert key names -> Hugging Face BERT's. Keys it has no mapping for
    (a pre-LN model's ``FinalLayerNorm``, say) are kept as they are, so that the strict
    load that follows refuses the checkpoint rather than silently re-initialising."""
    out = {}
    for key, value in state.items():
        for pattern, replacement in _ACADEMIC_BUDGET_BERT:
            key = pattern.sub(replacement, key)
        out[key] = value
    return out
