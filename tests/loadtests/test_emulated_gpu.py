"""loadtests/emulated_gpu.py: the stand-in for a GPU gives outputs of the model's shape
that the service postprocesses as it would a model's."""

from __future__ import annotations

import numpy as np

from distilserve.server.core import postprocess
from distilserve.server.core.batching import pad
from distilserve.server.engine import TokenIds
from loadtests.emulated_gpu import EmulatedGpu


def test_embeddings_have_a_length_so_normalising_them_is_the_usual_work():
    """Zeros have no length: every request's normalisation would take the float64 path
    kept for lengths out of float32's range, a cost a real model's embeddings do not have."""
    batch = pad([TokenIds([101, 7, 102], [0] * 3), TokenIds([101, 102], [0] * 2)])
    pooled = EmulatedGpu(width=8).run(batch)
    assert pooled.shape == (2, 8) and pooled.dtype == np.float32
    assert np.all(np.linalg.norm(pooled, axis=1) > 1e-18)  # normalize's float32 path
    assert np.allclose(np.linalg.norm(postprocess.normalize(pooled), axis=1), 1.0)
    assert EmulatedGpu(width=8, per_token=True).run(batch).shape == (2, 3, 8)  # [B, T, X]
