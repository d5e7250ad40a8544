"""What a sentence-transformers folder says of its embeddings, beside the Hugging Face
checkpoint it wraps: ``modules.json`` lists the modules applied after the encoder, the
Pooling module's ``config.json`` says how tokens are pooled, and
``sentence_bert_config.json`` gives the length the model was trained for.

    modules.json                 [Transformer "", Pooling "1_Pooling", Dense "2_Dense",
                                  Normalize "3_Normalize"]
    1_Pooling/config.json        {"pooling_mode": "cls"} (or the older pooling_mode_*_token
                                 flags: {"pooling_mode_cls_token": true, ...})
    2_Dense/config.json          {"in_features": 768, "out_features": 512, "bias": true,
                                  "activation_function": "torch.nn.modules.activation.Tanh"}
    2_Dense/model.safetensors    linear.weight, linear.bias (or pytorch_model.bin)
    sentence_bert_config.json    {"max_seq_length": 256}
    config_sentence_transformers.json
                                 {"prompts": {"query": "query: ", ...},
                                  "default_prompt_name": null}

A SPLADE model (sentence-transformers' SparseEncoder) has a masked-language model and a
SpladePooling module instead of the Transformer and the Pooling:

    modules.json                 [MLMTransformer "", SpladePooling "1_SpladePooling"]
    1_SpladePooling/config.json  {"pooling_strategy": "max", "activation_function": "relu"}

BGE's models pool the [CLS] token, all-MiniLM and E5 take the mean: served with the other
pooling, their embeddings would be quietly different. So the pooling is read here (any of
sentence-transformers' one-mode poolings but lasttoken, which is for decoders), and a
Dense module after it (distiluse's DistilBERT students map 768 -> 512 through a tanh,
LaBSE's BERT maps through one too); a module distilserve does not compute (lasttoken or
two poolings at once, a second Dense, a Dense on the token vectors) is refused, naming the
file, rather than left out. Prompts (E5's "query: ", BGE's instruction for queries) are
texts put before an input, by name. ``write`` puts the same files into a saved checkpoint,
so that an exported model folder's checkpoint says how it pools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from distilserve.models.tasks import POOLINGS  # the poolings computed here

# the module classes (the last part of modules.json's "type") that are computed here:
# the encoder itself (older versions named it by its architecture; a SPLADE model's is a
# masked-language model), its pooling (or SPLADE's: heads.splade), a Dense module, and
# normalisation (the service normalises embeddings)
ENCODERS = ("Transformer", "BERT", "DistilBERT", "ALBERT", "MLMTransformer")
KNOWN_MODULES = (*ENCODERS, "Pooling", "SpladePooling", "Dense", "Normalize")
# a Dense module's activations computed here: torch.nn's class -> its full name, as
# sentence-transformers writes it
ACTIVATIONS = {"Tanh": "torch.nn.modules.activation.Tanh",
               "Identity": "torch.nn.modules.linear.Identity",
               "ReLU": "torch.nn.modules.activation.ReLU",
               "GELU": "torch.nn.modules.activation.GELU",
               "Sigmoid": "torch.nn.modules.activation.Sigmoid"}
DENSE_PATH = "2_Dense"  # where ``write`` puts the Dense module
# older Pooling configs: one flag per mode
LEGACY_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean",
                "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean",
                "pooling_mode_lasttoken": "lasttoken"}


class SentenceTransformersError(Exception):
    """A sentence-transformers folder that distilserve cannot serve as it is."""


@dataclass(frozen=True)
class Dense:
    """A Dense module after the pooling: activation(linear(x)), [B, in] -> [B, out]."""

    path: str  # its folder, beside modules.json: config.json and its weights
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Tanh"  # one of ACTIVATIONS


@dataclass(frozen=True)
class Pipeline:
    """What follows the encoder: its pooling, a Dense module after it, the length it was
    trained for (None: not said), whether it normalises, and the prompts put before inputs
    by name (the default one before every input that names none)."""

    pooling: str = "mean"
    max_seq_length: int | None = None
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    dense: Dense | None = None


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
    if "Pooling" in kinds and "SpladePooling" in kinds:
        raise SentenceTransformersError(f"{file}: two poolings, Pooling and SpladePooling")
    if "Pooling" in kinds:
        pooling = _pooling(folder / str(kinds["Pooling"].get("path", "")) / "config.json")
    if "SpladePooling" in kinds:
        pooling = _splade(folder / str(kinds["SpladePooling"].get("path", "")) / "config.json")
    dense = None
    if "Dense" in kinds:
        order = list(kinds)
        where = folder / str(kinds["Dense"].get("path", ""))
        pooled = next((order.index(k) for k in ("Pooling", "SpladePooling") if k in kinds), -1)
        if order.index("Dense") < pooled:
            raise SentenceTransformersError(f"{file}: {where.name} comes before the pooling: "
                                            "a Dense module on the token vectors is not one "
                                            "distilserve computes")
        if pooling == "splade":
            raise SentenceTransformersError(f"{file}: {where.name} after SPLADE's pooling is "
                                            "not one distilserve computes")
        dense = _dense(where)
    length = None
    for where in (folder, encoder_folder(folder)):  # older ones keep it beside the encoder
        if (where / "sentence_bert_config.json").exists():
            length = _json(where / "sentence_bert_config.json").get("max_seq_length")
            break
    return Pipeline(pooling, length if isinstance(length, int) and length > 0 else None,
                    "Normalize" in kinds, *_prompts(folder / "config_sentence_transformers.json"),
                    dense)


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
    if config.get("include_prompt") is False:  # a prompt is part of the text here
        raise SentenceTransformersError(f"{file}: include_prompt false (pooling without the "
                                        "prompt's tokens) is not what distilserve computes")
    return modes[0]


def _splade(file: Path) -> str:
    """"splade" where SpladePooling's config asks for what heads.splade computes."""
    config = _json(file) if file.exists() else {}  # none: sentence-transformers' defaults
    how = (config.get("pooling_strategy") or "max", config.get("activation_function") or "relu")
    if how != ("max", "relu"):
        raise SentenceTransformersError(f"{file}: SPLADE pooling {how[0]} of {how[1]} is not "
                                        "one distilserve computes (max of relu)")
    return "splade"


def _dense(folder: Path) -> Dense:
    file = folder / "config.json"
    config = _json(file)
    activation = str(config.get("activation_function") or ACTIVATIONS["Tanh"])
    name = activation.rsplit(".", 1)[-1]
    if ACTIVATIONS.get(name) != activation:
        raise SentenceTransformersError(f"{file}: activation {activation} is not one distilserve "
                                        f"computes ({', '.join(ACTIVATIONS)})")
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise SentenceTransformersError(f"{file}: a Dense module on "
                                        f"{config['module_input_name']} is not one distilserve "
                                        "computes (only on the sentence embedding)")
    sizes = (config.get("in_features"), config.get("out_features"))
    if not all(isinstance(n, int) and n > 0 for n in sizes):
        raise SentenceTransformersError(f"{file}: in_features and out_features must be "
                                        "positive integers")
    return Dense(folder.name, *sizes, bool(config.get("bias", True)), name)


def _json(file: Path):
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise SentenceTransformersError(f"{file}: missing (modules.json names it)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SentenceTransformersError(f"{file}: not valid JSON ({e})") from None


def write(pipeline: Pipeline, folder: Path, width: int) -> None:
    """The files that describe ``pipeline`` after an encoder of ``width`` (SPLADE's: its
    vocabulary's size; a Dense module's weights are the caller's to write, into its
    folder, DENSE_PATH)."""
    if pipeline.pooling == "splade":
        kinds = [("", "sparse_encoder.modules.MLMTransformer"),
                 ("1_SpladePooling", "sparse_encoder.modules.SpladePooling")]
        (folder / "1_SpladePooling").mkdir(parents=True, exist_ok=True)
        (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(
            {"pooling_strategy": "max", "activation_function": "relu",
             "embedding_dimension": width}, indent=2) + "\n")
    else:
        kinds = [("", "models.Transformer"), ("1_Pooling", "models.Pooling")]
        (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": width,
             **{flag: mode == pipeline.pooling for flag, mode in LEGACY_FLAGS.items()}},
            indent=2) + "\n")
    if pipeline.dense:
        kinds.append((DENSE_PATH, "models.Dense"))
        dense = pipeline.dense
        (folder / DENSE_PATH).mkdir(parents=True, exist_ok=True)
        (folder / DENSE_PATH / "config.json").write_text(json.dumps(
            {"in_features": dense.in_features, "out_features": dense.out_features,
             "bias": dense.bias, "activation_function": ACTIVATIONS[dense.activation]},
            indent=2) + "\n")
    if pipeline.normalize:
        kinds.append((f"{len(kinds)}_Normalize", "models.Normalize"))
        (folder / kinds[-1][0]).mkdir(parents=True, exist_ok=True)
    modules = [{"idx": i, "name": str(i), "path": path,
                "type": f"sentence_transformers.{kind}"} for i, (path, kind) in enumerate(kinds)]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    if pipeline.max_seq_length:
        (folder / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": pipeline.max_seq_length, "do_lower_case": False}) + "\n")
    if pipeline.prompts or pipeline.pooling == "splade":
        # a SparseEncoder's own kind: said, or sentence-transformers adds a module of its own
        kind = {"model_type": "SparseEncoder"} if pipeline.pooling == "splade" else {}
        (folder / "config_sentence_transformers.json").write_text(json.dumps(
            {"prompts": pipeline.prompts, "default_prompt_name": pipeline.default_prompt_name,
             **kind}, indent=2) + "\n")
