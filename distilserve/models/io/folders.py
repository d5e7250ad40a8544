"""Folders written whole: a model folder is made beside its place, then put there by
renames, so that a reader (a serving process, a later load) finds the old folder or the
new one, never a half-written one."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(output: Path) -> Iterator[Path]:
    """An empty folder beside ``output`` to write into, put in its place when the block
    ends, and removed if the block raises. Made with the umask's mode, as the files in it
    are (mkdtemp's would be 0700: a folder written by one user, unreadable to a service
    running as another)."""
    output = output.resolve()  # (".": its name, its parent)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.{uuid.uuid4().hex[:12]}"
    try:
        staging.mkdir()
    except OSError as e:  # (named as the caller named it, not as the staging folder)
        raise OSError(e.errno, f"cannot write beside it ({e.strerror})", str(output)) from None
    try:
        yield staging
        replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace(new: Path, output: Path) -> None:
    """Puts the complete folder ``new`` at ``output`` by two renames: ``output`` holds the
    old folder until an instant before it holds the new one, and never a half-written one
    (a server's next load finds one or the other, or for that instant none)."""
    old = None
    if output.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
        try:
            output.rename(old / "model")
        except OSError:  # (a mount point, say): nothing left beside it
            old.rmdir()
            raise
    new.rename(output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
