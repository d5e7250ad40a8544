"""The teacher of a distillation (distilserve/training/distill.py), and the students it
starts. Every student starts from the teacher's weights where the shapes allow, which
"How to Distill your BERT" finds decisive and F-ALBERT does for its own students: BERT
from the teacher's lower layers; MiniALBERT and F-ALBERT with a truncated-SVD
factorisation of the teacher's word embeddings and the shared layer from the teacher's
first layer; CMOW as a bag of the teacher's word vectors."""

from __future__ import annotations

from pathlib import Path

import torch

from distilserve.models import heads
from distilserve.models.io import checkpoint
from distilserve.models.io.checkpoint import Checkpoint
from distilserve.training import STUDENT_PRESET


class Teacher:
    """The teacher's per-layer hidden states and attention maps, and its embedding."""

    def __init__(self, path: Path):
        self.ckpt = checkpoint.load(path, task="embed")
        if self.ckpt.family != "bert":  # (the objectives read its layers as BERT's)
            raise ValueError(f"--teacher {path}: a {self.ckpt.family} checkpoint, where a "
                             "teacher is a bert-family encoder (BERT, MiniLM, TinyBERT, "
                             "MobileBERT), whose hidden states and attention maps the "
                             "objectives read")
        self.hf = self.ckpt.model.model
        self.hf.config._attn_implementation = "eager"  # attention maps need eager attention
        self.hf.eval().requires_grad_(False)

    @torch.no_grad()
    def __call__(self, batch: dict) -> dict:
        out = self.hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"], output_hidden_states=True,
                      output_attentions=True)
        return {"hidden": out.hidden_states[1:], "attention": out.attentions,
                "last": out.last_hidden_state,
                "pooled": heads.mean_pool(out.last_hidden_state, batch["attention_mask"])}


def check_preset(family: str, preset: str, teacher: Teacher, max_length: int) -> None:
    """Refuses, before any training, a student that cannot learn from this teacher."""
    if family == "bert" and preset == STUDENT_PRESET["bert"]:
        return
    config = checkpoint.preset_config(family, preset)  # unknown: CheckpointError
    vocab, positions = config.get("vocab_size"), checkpoint.positions(config)
    if vocab != teacher.hf.config.vocab_size:
        raise ValueError(f"{family} preset {preset!r} has a vocabulary of {vocab} tokens, "
                         f"the teacher's tokenizer {teacher.hf.config.vocab_size}")
    if positions < max_length:
        raise ValueError(f"{family} preset {preset!r} takes at most {positions} tokens, "
                         f"fewer than the {max_length} distillation trains on")


def new_student(family: str, preset: str, teacher: Teacher, seed: int,
                overrides: dict | None = None) -> Checkpoint:
    if family == "bert" and preset != STUDENT_PRESET["bert"]:  # a named size, fresh weights
        student = checkpoint.new("bert", preset, "embed", seed=seed, overrides=overrides)
        init_bert_from_teacher(student, teacher)
        return student
    if family == "bert":  # the teacher's config with half the layers, lower layers copied
        config = teacher.hf.config.to_dict()
        layers = config["num_hidden_layers"] // 2
        from distilserve.models import bert

        torch.manual_seed(seed)
        model = bert.build({**config, "num_hidden_layers": layers}, "embed", [])
        state = {k: v for k, v in teacher.hf.state_dict().items()
                 if not k.startswith("encoder.layer.") or int(k.split(".")[2]) < layers}
        model.model.load_state_dict(state, strict=False)
        return Checkpoint(model, "bert", "embed", [], model.model.config.to_dict(),
                          teacher.ckpt.tokenizer_dir)
    if family == "cmow":  # embeddings in the teacher's space, through a learned map
        overrides = {**(overrides or {}), "projection_size": teacher.hf.config.hidden_size}
    student = checkpoint.new(family, preset, "embed", seed=seed, overrides=overrides)
    if family in ALBERT_PARTS:
        init_from_teacher(student, teacher)
    if family == "cmow":
        init_cmow_from_teacher(student, teacher)
    return student


@torch.no_grad()
def init_bert_from_teacher(student: Checkpoint, teacher: Teacher) -> None:
    """A BERT student of another size takes every teacher tensor of the same name and
    shape (all of them for MiniLM's own size; the embeddings' LayerNorm for a narrower
    one, say); the rest keeps its fresh weights."""
    own = student.model.model.state_dict()
    fitting = {k: v for k, v in teacher.hf.state_dict().items()
               if k in own and own[k].shape == v.shape}
    student.model.model.load_state_dict(fitting, strict=False)


@torch.no_grad()
def init_cmow_from_teacher(student: Checkpoint, teacher: Teacher) -> None:
    """CMOW/CBOW-Hybrid starts as a bag of the teacher's word vectors: its CBOW vectors are
    the teacher's word embeddings and its projection passes the CBOW sum through (the
    matrix products start near the identity and at weight 0); training then brings in
    word order."""
    model = student.model
    vectors = model.transformer.embeddings.vector_embedding.weight  # [V, E]
    word = teacher.hf.embeddings.word_embeddings.weight  # [V, D]
    if len(vectors) != len(word) or vectors.shape[1] < word.shape[1]:
        return
    width = word.shape[1]
    vectors.zero_()
    vectors[:, :width] = word
    model.projection.weight.zero_()  # [D, 1200]: cbow || fw || bw
    model.projection.weight[:, :width] = torch.eye(width)
    model.projection.bias.zero_()


# where the factorised embedding's projection and the shared layer live in each family
ALBERT_PARTS = {"minialbert": ("albert.projector", "albert.albert.encoder.albert_layer_groups.0"
                               ".albert_layers.0"),
                "falbert": ("albert.encoder.embedding_hidden_mapping_in",
                            "albert.encoder.albert_layer_groups.0.albert_layers.0")}
# shared ALBERT layer <- BERT layer (transformers' names on both sides)
LAYER_NAMES = {"attention.query": "attention.self.query", "attention.key": "attention.self.key",
               "attention.value": "attention.self.value",
               "attention.dense": "attention.output.dense",
               "attention.LayerNorm": "attention.output.LayerNorm",
               "ffn": "intermediate.dense", "ffn_output": "output.dense",
               "full_layer_layer_norm": "output.LayerNorm"}


@torch.no_grad()
def init_from_teacher(student: Checkpoint, teacher: Teacher, layer: int = 0) -> None:
    """Starts a recursive student from the teacher's weights, as F-ALBERT's students start
    from their teacher's (F-ALBERT) and "How to Distill your BERT" finds teacher
    initialisation decisive:
    the factorised embedding [V, E] x projection [E, D] from a truncated SVD of the
    teacher's word embeddings, the shared layer from teacher layer ``layer``, adapters
    starting as (almost) the identity."""
    projection, shared = ALBERT_PARTS[student.family]
    params = dict(student.model.named_parameters())
    t = {k.removeprefix("model."): v for k, v in teacher.ckpt.model.state_dict().items()}
    pairs = {f"{shared}.{ours}.{kind}": f"encoder.layer.{layer}.{theirs}.{kind}"
             for ours, theirs in LAYER_NAMES.items() for kind in ("weight", "bias")}
    if any(t[theirs].shape != params[ours].shape for ours, theirs in pairs.items()):
        return  # a student the teacher cannot align with starts from random weights
    word = t["embeddings.word_embeddings.weight"]  # [V, D]
    rank = params[projection + ".weight"].shape[1]  # E
    _, _, vh = torch.linalg.svd(word, full_matrices=False)
    basis = vh[:rank].T  # [D, E]: the span the student's embeddings live in
    emb = next(k for k in params if k.endswith("embeddings.word_embeddings.weight"))
    emb = emb.removesuffix("word_embeddings.weight")
    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        target = params[f"{emb}{table}.weight"]
        target.copy_(t[f"embeddings.{table}.weight"][: len(target)] @ basis)
    params[emb + "LayerNorm.weight"].fill_(1.0)
    params[emb + "LayerNorm.bias"].zero_()
    # the teacher's LayerNorm gain and bias, folded into the projection; the E-wide
    # normalised vector is sqrt(D / E) times shorter than a D-wide one
    gain = t["embeddings.LayerNorm.weight"][:, None] * (word.shape[1] / rank) ** 0.5
    params[projection + ".weight"].copy_(gain * basis)
    params[projection + ".bias"].copy_(t["embeddings.LayerNorm.bias"])
    for ours, theirs in pairs.items():
        params[ours].copy_(t[theirs])
    for name, value in params.items():  # adapters: LayerNorm(x + 0)
        if name.endswith("adapters.up_weight"):
            value.zero_()
