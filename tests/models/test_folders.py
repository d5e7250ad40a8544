"""distilserve/models/io/folders.py: a folder written beside its place, then renamed in."""

from __future__ import annotations

from pathlib import Path

import pytest

from distilserve.models.io.folders import replacing


def test_a_folder_named_as_the_current_one_is_replaced(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "old.txt").write_text("old")
    monkeypatch.chdir(tmp_path / "model")
    with replacing(Path(".")) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # nothing left beside it
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["new.txt"]


def test_a_failed_write_or_rename_leaves_the_old_folder_alone(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), replacing(tmp_path / "model") as staging:
        (staging / "half.txt").write_text("half")
        raise RuntimeError("the write failed")
    rename = Path.rename

    def busy(self, target):  # the old folder cannot be moved (a mount point, say)
        if self == tmp_path / "model":
            raise OSError(16, "Device or resource busy")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", busy)
    with pytest.raises(OSError, match="busy"), replacing(tmp_path / "model") as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["old.txt"]


def test_a_folder_that_cannot_be_written_beside_is_named_as_asked(tmp_path, monkeypatch):
    mkdir = Path.mkdir

    def denied(self, *args, **kwargs):
        if self.name.startswith(".model."):  # the staging folder
            raise PermissionError(13, "Permission denied", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(OSError) as raised, replacing(tmp_path / "model"):
        pass
    assert raised.value.filename == str(tmp_path / "model")
    assert raised.value.strerror == "cannot write beside it (Permission denied)"
