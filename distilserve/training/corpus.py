"""Real English prose available offline: the docstrings of the Python standard library
and of installed packages, split into sentences, filtered, deduplicated, shuffled with a
seed, with a held-out part (chosen by a hash of the sentence, so it never depends on what
else was found) that is never trained on. Reading them takes a while: it says how far
along it is, and keeps what it found in a cache file for the next time."""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CODE = re.compile(r"[`<>{}\[\]=_|\\#@$]|\(\)|::|->|\.\w+\(|\w+\.\w+\.|^\W|>>>|http")


def _docstrings(path: Path):
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                yield doc


def _sentences(doc: str):
    for paragraph in re.split(r"\n\s*\n", doc):
        if paragraph.lstrip().startswith((">>>", "..", ":", "-", "*")):
            continue
        text = " ".join(paragraph.split())
        for sentence in _SENTENCE_END.split(text):
            words = sentence.split()
            if (6 <= len(words) <= 40 and sentence[0].isupper() and sentence[-1] in ".!?"
                    and not _CODE.search(sentence)
                    and sum(w.isalpha() for w in words) >= 0.8 * len(words)):
                yield sentence


def _read(roots: list[Path], limit: int, progress: Callable[[str], None]) -> list[str]:
    """Up to ``limit`` sentences, in the order found."""
    seen: dict[str, None] = {}
    files = 0
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "test" in path.parts or "tests" in path.parts:
                continue
            for doc in _docstrings(path):
                for s in _sentences(doc):
                    seen.setdefault(s)
            files += 1
            if files % 500 == 0:
                progress(f"reading sentences from installed docstrings: {len(seen):,} of "
                         f"{limit:,} from {files:,} files")
            if len(seen) >= limit:
                return list(seen)
    return list(seen)


def held_out(sentence: str, fraction: float = 0.1) -> bool:
    return int(hashlib.sha1(sentence.encode()).hexdigest()[:8], 16) < fraction * 0xFFFFFFFF


def sentences(limit: int = 60_000, seed: int = 0, roots: list[Path] | None = None,
              progress: Callable[[str], None] | None = None,
              cache: Path | None = None) -> tuple[list[str], list[str]]:
    """(train, held_out) sentences from docstrings under ``roots`` (default: the standard
    library and site-packages), read once: kept in a file of the folder ``cache`` (named
    by what was read: the roots, the limit, Python's version) and read from it after;
    ``progress`` hears how far along the reading is."""
    if roots is None:
        paths = sysconfig.get_paths()
        roots = [Path(paths["stdlib"]), Path(paths["purelib"])]
    key = hashlib.sha1(json.dumps([[str(r) for r in roots], limit, sys.version]).encode())
    kept = cache / f"corpus-{key.hexdigest()[:16]}.json" if cache is not None else None
    if kept is not None and kept.is_file():
        found = json.loads(kept.read_text())
    else:
        found = _read(roots, limit, progress or (lambda said: None))
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            partial = kept.with_suffix(".partial")
            partial.write_text(json.dumps(found))
            partial.replace(kept)
    random.Random(seed).shuffle(found)
    return [s for s in found if not held_out(s)], [s for s in found if held_out(s)]
