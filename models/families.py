"""Every model family, one entry each: what the rest of the code needs to know about it.

A family is one file (models/NAME.py: its config, its model, its presets, the layouts its
authors published) and one entry here. Checkpoint I/O, export, the runtime backends, the
bench and the CLI read this registry; nothing else lists families.
"""

from __future__ import annotations

from dataclasses import dataclass

from models import bert, cmow, falbert, minialbert

ALL_DTYPES = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Family:
    name: str
    presets: dict[str, dict]  # preset -> config fields; every family has "tiny"
    model_types: tuple[str, ...]  # config.json model_type values loaded as this family
    # None: a transformers model, built and loaded by models/bert.py
    config_class: type | None = None
    model_class: type | None = None
    architecture: str | None = None  # config.json "architectures": this + the task's suffix
    recursive: bool = False  # one shared layer applied many times (export --loop keep)
    pooling: str = "mean"  # how an embedding is pooled (the manifest's "pooling")
    # a vector per token that an embedding model can give unpooled (export
    # --token-embeddings); CMOW's embedding is a product of token matrices
    token_vectors: bool = True
    dtypes: tuple[str, ...] = ALL_DTYPES  # compute dtypes it runs in

    @property
    def transformers(self) -> bool:
        """Built from transformers' classes (models/bert.py) rather than its own."""
        return self.model_class is None


REGISTRY: dict[str, Family] = {f.name: f for f in (
    Family("bert", bert.PRESETS["bert"], ("bert", "mobilebert", "albert")),
    Family("distilbert", bert.PRESETS["distilbert"], ("distilbert",)),
    Family("minialbert", minialbert.PRESETS, ("minialbert",), minialbert.MiniAlbertConfig,
           minialbert.MiniAlbert, "MiniAlbert", recursive=True),
    Family("falbert", falbert.PRESETS, ("falbert",), falbert.FAlbertConfig, falbert.FAlbert,
           "FAlbert", recursive=True),
    Family("cmow", cmow.PRESETS, ("seq2mat",), cmow.CmowConfig, cmow.Cmow, "Seq2Mat",
           pooling="cmow", dtypes=cmow.DTYPES, token_vectors=False),
)}
FAMILIES = tuple(REGISTRY)
RECURSIVE = tuple(f.name for f in REGISTRY.values() if f.recursive)
BY_MODEL_TYPE = {t: f for f in REGISTRY.values() for t in f.model_types}


def get(name: str) -> Family:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; families: {', '.join(FAMILIES)}") from None
