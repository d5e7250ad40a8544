"""A checkpoint's tensors: read from its weights file (safetensors, or an older
``pytorch_model.bin`` with ``weights_only=True``, never a plain pickle), and loaded into a
model strictly: a missing, unexpected or mis-shaped tensor, or one holding NaN or infinity,
is an error naming the file and the tensors; another task's head, a pooler and buffers
may be left over."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from distilserve.models.io import CheckpointError


def read_state_dict(path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The weights file of a checkpoint folder and its tensors (never plain pickle)."""
    file = path / "model.safetensors"
    try:
        if file.exists():
            return file, load_file(str(file))
        file = path / "pytorch_model.bin"
        if file.exists():
            return file, torch.load(file, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, ValueError, EOFError) as e:
        raise CheckpointError(f"{file}: unreadable weights file ({e})") from None
    except Exception as e:  # torch.load refusing a pickle that is more than tensors
        raise CheckpointError(f"{file}: refused ({type(e).__name__}: {e})") from None
    raise CheckpointError(f"{path}: no model.safetensors or pytorch_model.bin")


def _droppable(key: str, top_level: set[str]) -> bool:
    """A tensor a task model may ignore: another task's head (BERT's next-sentence head, in
    a pre-training checkpoint beside its masked-language one), a pooler, a buffer."""
    return (key.split(".")[0] not in top_level or ".pooler." in f".{key}"
            or ".seq_relationship." in f".{key}" or key.endswith("position_ids"))


def _tied(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the names of a tensor the model shares filled in from one another
    (transformers saves a tied weight once: a masked-language head's decoder is the word
    embeddings)."""
    shared: dict[int, list[str]] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(tensor), []).append(name)
    filled = dict(state)
    for names in shared.values():
        saved = next((n for n in names if n in state), None)
        for name in names if saved else ():
            filled.setdefault(name, state[saved])
    return filled


def _shown(keys: list[str]) -> str:
    return ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], file: Path,
                 unused: str | None = None) -> None:
    """Loads ``state`` into ``model`` or raises CheckpointError naming the tensors that do
    not fit it, or else those holding NaN or infinity; those under ``unused`` (a prefix: a
    part the model has and its task never runs) may be missing, and keep their fresh
    values."""
    state = _tied(model, state)
    expected = model.state_dict()
    top_level = {k.split(".")[0] for k in expected}
    missing = sorted(k for k in set(expected) - set(state)
                     if unused is None or not k.startswith(unused))
    unexpected = sorted(k for k in set(state) - set(expected) if not _droppable(k, top_level))
    shapes = sorted(f"{k} {tuple(state[k].shape)} (expected {tuple(v.shape)})"
                    for k, v in expected.items() if k in state and state[k].shape != v.shape)
    problems = []
    for what, keys in (("missing", missing), ("unexpected", unexpected),
                       ("wrong shape", shapes)):
        if keys:
            problems.append(f"{len(keys)} {what}: {_shown(keys)}")
    if problems:
        raise CheckpointError(f"{file}: tensors do not fit the model: " + "; ".join(problems))
    # a model whose outputs would all be NaN (a training run that diverged)
    broken = sorted(k for k in expected if k in state and state[k].is_floating_point()
                    and not bool(torch.isfinite(state[k]).all()))
    if broken:
        raise CheckpointError(f"{file}: NaN or infinity in {len(broken)} of its tensors: "
                              f"{_shown(broken)}")
    model.load_state_dict({k: state[k] for k in expected if k in state}, strict=False)
