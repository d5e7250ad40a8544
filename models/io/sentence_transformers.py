"""What a sentence-transformers folder says of its embeddings, beside the Hugging Face
checkpoint it wraps: ``modules.json`` lists the modules applied after the encoder, the
Pooling module's ``config.json`` says how tokens are pooled, and
``sentence_bert_config.json`` gives the length the model was trained for.

    modules.json                 [Transformer "", Pooling "1_Pooling", Normalize "2_Normalize"]
    1_Pooling/config.json        {"pooling_mode": "cls"} (or the older pooling_mode_*_token
                                 flags: {"pooling_mode_cls_token": true, ...})
    sentence_bert_config.json    {"max_seq_length": 256}
    config_sentence_transformers.json
                                 {"prompts": {"query": "query: ", ...},
                                  "default_prompt_name": null}

BGE's models pool the [CLS] token, all-MiniLM and E5 take the mean: served with the other
pooling, their embeddings would be quietly different. So the pooling is read here, and a
module distilserve does not compute (a Dense projection, max pooling) is refused, naming
the file, rather than left out. Prompts (E5's "query: ", BGE's instruction for queries) are
texts put before an input, by name. ``write`` puts the same files into a saved
checkpoint, so that an exported model folder's checkpoint says how it pools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

POOLINGS = ("mean", "cls")  # what heads.pool computes
# the module classes (the last part of modules.json's "type") that are computed here:
# the encoder itself (older versions named it by its architecture), its pooling, and
# normalisation (the service normalises embeddings)
ENCODERS = ("Transformer", "BERT", "DistilBERT", "ALBERT")
KNOWN_MODULES = (*ENCODERS, "Pooling", "Normalize")
# older Pooling configs: one flag per mode
LEGACY_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean",
                "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean",
                "pooling_mode_lasttoken": "lasttoken"}


class SentenceTransformersError(Exception):
    """A sentence-transformers folder that distilserve cannot serve as it is."""


@dataclass(frozen=True)
class Pipeline:
    """What follows the encoder: its pooling, the length it was trained for (None: not
    said), whether it normalises, and the prompts put before inputs by name (the default
    one before every input that names none)."""

    pooling: str = "mean"
    max_seq_length: int | None = None
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


def encoder_folder(folder: Path) -> Path:
    """Where a sentence-transformers folder keeps its encoder (config.json, weights,
    tokenizer): the folder itself, or in older ones the encoder module's subfolder
    (``0_Transformer/``, ``0_BERT/``)."""
    if (folder / "config.json").exists() or not (folder / "modules.json").exists():
        return folder
    kinds = _modules(folder / "modules.json")
    path = next((str(kinds[k].get("path") or "") for k in ENCODERS if k in kinds), "")
    return folder / path if path and (folder / path / "config.json").exists() else folder


def _modules(file: Path) -> dict[str, dict]:
    """modules.json's modules by class name."""
    modules = _json(file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise SentenceTransformersError(f"{file}: not a list of modules")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
    if len(kinds) < len(modules):
        raise SentenceTransformersError(f"{file}: a module repeated; distilserve computes "
                                        f"each of {', '.join(KNOWN_MODULES)} once")
    return kinds


def read(folder: Path) -> Pipeline | None:
    """The pipeline ``folder`` describes; None where it has no modules.json."""
    file = folder / "modules.json"
    if not file.exists():
        return None
    kinds = _modules(file)
    unknown = [f"{m.get('path') or m.get('name')} ({m.get('type')})" for kind, m in kinds.items()
               if kind not in KNOWN_MODULES]
    if unknown:
        raise SentenceTransformersError(
            f"{file}: modules {', '.join(unknown)} are not ones distilserve computes "
            f"({', '.join(KNOWN_MODULES)}): served without them, the embeddings would differ")
    pooling = "mean"  # a sentence-transformers model without a Pooling module: the mean
    if "Pooling" in kinds:
        pooling = _pooling(folder / str(kinds["Pooling"].get("path", "")) / "config.json")
    length = None
    for where in (folder, encoder_folder(folder)):  # older ones keep it beside the encoder
        if (where / "sentence_bert_config.json").exists():
            length = _json(where / "sentence_bert_config.json").get("max_seq_length")
            break
    return Pipeline(pooling, length if isinstance(length, int) and length > 0 else None,
                    "Normalize" in kinds, *_prompts(folder / "config_sentence_transformers.json"))


def _prompts(file: Path) -> tuple[dict[str, str], str | None]:
    config = _json(file) if file.exists() else {}
    prompts, default = config.get("prompts") or {}, config.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise SentenceTransformersError(f"{file}: prompts must map names to texts")
    if default is not None and default not in prompts:
        raise SentenceTransformersError(f"{file}: default_prompt_name {default!r} is not one "
                                        f"of its prompts ({', '.join(prompts) or 'none'})")
    return prompts, default


def _pooling(file: Path) -> str:
    config = _json(file)
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for flag, mode in LEGACY_FLAGS.items() if config.get(flag)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise SentenceTransformersError(
            f"{file}: pooling {' + '.join(map(str, modes))} is not one distilserve computes "
            f"({', '.join(POOLINGS)})")
    return modes[0]


def _json(file: Path):
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise SentenceTransformersError(f"{file}: missing (modules.json names it)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SentenceTransformersError(f"{file}: not valid JSON ({e})") from None


def write(pipeline: Pipeline, folder: Path, width: int) -> None:
    """The files that describe ``pipeline`` after an encoder of ``width``."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if pipeline.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(parents=True, exist_ok=True)
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": width,
         **{flag: mode == pipeline.pooling for flag, mode in LEGACY_FLAGS.items()}},
        indent=2) + "\n")
    if pipeline.max_seq_length:
        (folder / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": pipeline.max_seq_length, "do_lower_case": False}) + "\n")
    if pipeline.prompts:
        (folder / "config_sentence_transformers.json").write_text(json.dumps(
            {"prompts": pipeline.prompts, "default_prompt_name": pipeline.default_prompt_name},
            indent=2) + "\n")
