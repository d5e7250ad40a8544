"""Checkpoint I/O: checkpoint folders of every family (checkpoint.py) and model folders'
manifests (manifest.py)."""


class CheckpointError(Exception):
    """A checkpoint that cannot be used as it is; the message names the file. (Here, not in
    checkpoint.py, so that the CLI catches it without importing torch.)"""
