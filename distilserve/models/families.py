"""Every model family, one entry each: what the rest of the code needs to know about it.

A family is one file (distilserve/models/NAME.py: its config, its model, its presets, the layouts its
authors published) and one entry here. Checkpoint I/O, export, the runtime backends, the
bench and the CLI read this registry; nothing else lists families.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ALL_DTYPES = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Family:
    """A family's facts, and its classes and presets from its file, imported when first
    asked for (torch): reading a manifest or serving an ONNX model needs only the facts."""

    name: str
    module: str  # distilserve/models/MODULE.py: its config, model and PRESETS
    model_types: tuple[str, ...]  # config.json model_type values loaded as this family
    # its config and model classes in the module; None: a transformers model, built and
    # loaded by distilserve/models/bert.py (whose PRESETS holds a table per family)
    classes: tuple[str, str] | None = None
    architecture: str | None = None  # config.json "architectures": this + the task's suffix
    recursive: bool = False  # one shared layer applied many times (export --loop keep)
    pooling: str = "mean"  # how an embedding is pooled (the manifest's "pooling")
    # a vector per token that an embedding model can give unpooled (export
    # --token-embeddings); CMOW's embedding is a product of token matrices
    token_vectors: bool = True
    dtypes: tuple[str, ...] = ALL_DTYPES  # compute dtypes it runs in
    # its forward pass is mostly large matrix products, which a CPU's bf16 matrix units
    # speed up: dtype auto runs it in bf16 there (models/runtime/base.choose_dtype)
    cpu_bf16: bool = True

    @property
    def transformers(self) -> bool:
        """Built from transformers' classes (distilserve/models/bert.py) rather than its own."""
        return self.classes is None

    def _module(self) -> ModuleType:
        return importlib.import_module(f"distilserve.models.{self.module}")

    @property
    def presets(self) -> dict[str, dict]:  # preset -> config fields; every family has "tiny"
        presets = self._module().PRESETS
        return presets[self.name] if self.transformers else presets

    @property
    def preset_names(self) -> list[str]:
        """The presets' names, read from the family's file without importing it (nor torch
        with it): the keys of its PRESETS (its own table in it, for transformers' families)."""
        tree = ast.parse(Path(__file__).with_name(f"{self.module}.py").read_text())
        table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(getattr(t, "id", None) == "PRESETS" for t in node.targets))
        if self.transformers:
            table = table.values[[key.value for key in table.keys].index(self.name)]
        return [key.value for key in table.keys]

    @property
    def config_class(self) -> type | None:
        return None if self.classes is None else getattr(self._module(), self.classes[0])

    @property
    def model_class(self) -> type | None:
        return None if self.classes is None else getattr(self._module(), self.classes[1])


REGISTRY: dict[str, Family] = {f.name: f for f in (
    Family("bert", "bert", ("bert", "mobilebert", "albert")),
    Family("distilbert", "bert", ("distilbert",)),
    Family("minialbert", "minialbert", ("minialbert",), ("MiniAlbertConfig", "MiniAlbert"),
           "MiniAlbert", recursive=True),
    Family("falbert", "falbert", ("falbert",), ("FAlbertConfig", "FAlbert"), "FAlbert",
           recursive=True),
    # CMOW's matrix products pass fp16's largest number (65504); bf16 has fp32's range.
    # They are products of small matrices, which bf16 slows down on a CPU.
    Family("cmow", "cmow", ("seq2mat",), ("CmowConfig", "Cmow"), "Seq2Mat",
           pooling="cmow", dtypes=("fp32", "bf16"), token_vectors=False, cpu_bf16=False),
)}
FAMILIES = tuple(REGISTRY)
RECURSIVE = tuple(f.name for f in REGISTRY.values() if f.recursive)
BY_MODEL_TYPE = {t: f for f in REGISTRY.values() for t in f.model_types}


def get(name: str) -> Family:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; families: {', '.join(FAMILIES)}") from None
