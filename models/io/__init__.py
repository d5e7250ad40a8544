"""Checkpoint I/O: checkpoint folders of every family (checkpoint.py) and model folders'
manifests (manifest.py)."""
