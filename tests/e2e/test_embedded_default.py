"""The embedded default: built on an empty cache, serving all three tasks with models
that really work; the second start reuses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distilserve.models import samples
from distilserve.models.runtime.matrix_units import bf16_units
from distilserve.server import embedded_default as default
from distilserve.training import handwritten
from tests import web
from tests.conftest import free_port, running_server, wait_until_ready

pytestmark = pytest.mark.slow  # builds the embedded default (fine-tuning)

ROOT = Path(__file__).resolve().parents[2]

# Written by hand for this test; none of them comes from distilserve/training/synthetic.py or is in
# distilserve/training/handwritten.py (the development set the build scores the models on).
POSITIVE = ["I absolutely loved every minute of it.",
            "The waiter was friendly and the soup was delicious.",
            "Best holiday we have had in years!",
            "Everything worked perfectly out of the box.",
            "Our guide was knowledgeable, funny and kind."]
NEGATIVE = ["This was the worst purchase I have ever made.",
            "My package arrived damaged and customer support ignored me.",
            "The plot made no sense and the acting was wooden.",
            "The battery died after two days, very disappointing.",
            "The hotel room was dirty and smelled of smoke."]
NEUTRAL = ["The bus stop is across the street from the bank.",
           "Her appointment was moved to Thursday afternoon.",
           "The manual is available in English and Spanish."]
NATURAL = [("Tim Cook presented the new iPhone at Apple's campus in Cupertino.",
            {("PER", "Tim Cook"), ("ORG", "Apple"), ("LOC", "Cupertino")}),
           ("Last spring Maria Gonzalez joined Siemens in Munich.",
            {("PER", "Maria Gonzalez"), ("ORG", "Siemens"), ("LOC", "Munich")}),
           ("The mayor of Chicago thanked Boeing for the donation, said Linda Park.",
            {("LOC", "Chicago"), ("ORG", "Boeing"), ("PER", "Linda Park")})]


@pytest.fixture(scope="module")
def built(embedded_default):
    return embedded_default


def test_second_start_does_not_rebuild(built):
    cache, folder = built
    stamp = (folder / default.STAMP).stat().st_mtime_ns
    assert default.ensure_default_repository(cache) == folder
    assert (folder / default.STAMP).stat().st_mtime_ns == stamp  # not written again
    assert sorted(p.name for p in cache.iterdir()) == [".build.lock", folder.name]


def test_manifests_say_how_the_models_were_made(built):
    _, folder = built
    ner = json.loads((folder / "minilm-ner" / "manifest.json").read_text())
    assert ner["training"]["held_out_f1"] > 0.9 and "Faker" in ner["training"]["how"]
    assert ner["training"]["hand_written_f1"] > 0.8
    assert ner["training"]["hand_written_sentences"] == len(handwritten.NER)
    sentiment = json.loads((folder / "minilm-sentiment" / "manifest.json").read_text())
    assert sentiment["labels"] == ["negative", "neutral", "positive"]
    assert sentiment["training"]["hand_written_accuracy"] > 0.8
    for model in (ner, sentiment):
        assert model["training"]["frozen"] == "word embeddings"
        assert model["training"]["precision"] == (f"bf16 autocast ({bf16_units()})"
                                                  if bf16_units() else "fp32")


def test_default_serves_all_three_tasks_and_they_work(built):
    _, folder = built
    with running_server(folder) as url:
        models = {m["id"]: m["task"] for m in web.get(url + "/v1/models").json()["data"]}
        assert models == {"all-minilm-l6-v2": "embed", "minilm-sentiment": "classify",
                          "minilm-ner": "ner"}
        emb = web.post(url + "/v1/embeddings", json={"input": "hello"}, timeout=60).json()
        assert len(emb["data"][0]["embedding"]) == 384

        ranked = web.post(url + "/v1/rerank", timeout=60, json={
            "query": "Where is the Eiffel Tower?",
            "documents": ["Bananas are rich in potassium.",
                          "The Eiffel Tower stands in Paris, France."]}).json()
        assert ranked["model"] == "all-minilm-l6-v2"  # unnamed: the embedding model
        assert ranked["results"][0]["index"] == 1

        res = web.post(url + "/v1/classify", json={"inputs": POSITIVE + NEGATIVE + NEUTRAL,
                                                     "top_k": 1}, timeout=60).json()["results"]
        labels = [r[0]["label"] for r in res]
        assert labels == ["positive"] * 5 + ["negative"] * 5 + ["neutral"] * 3

        res = web.post(url + "/v1/ner", json={"inputs": [t for t, _ in NATURAL]},
                         timeout=60).json()
        for (text, expected), found in zip(NATURAL, res["results"]):
            got = {(e["entity_group"], e["word"]) for e in found}
            assert expected <= got, (text, found)
            assert all(text[e["start"]:e["end"]] == e["word"] for e in found)


def _answers(url: str) -> tuple[list, list, np.ndarray]:
    """Labels of the hand-written sentiment sentences, entities of the hand-written NER
    sentences, and embeddings of real sentences."""
    texts = [s for s, _ in handwritten.SENTIMENT] + POSITIVE + NEGATIVE + NEUTRAL
    res = web.post(url + "/v1/classify", json={"inputs": texts, "top_k": 1},
                     timeout=120).json()["results"]
    labels = [r[0]["label"] for r in res]
    res = web.post(url + "/v1/ner", json={"inputs": [t for t, _ in handwritten.NER]},
                     timeout=120).json()["results"]
    entities = [{(e["entity_group"], e["start"], e["end"]) for e in found} for found in res]
    sentences = list(samples.SENTENCES) + texts
    res = web.post(url + "/v1/embed", json={"inputs": sentences}, timeout=120).json()
    return labels, entities, np.array(res["embeddings"])


def test_bf16_gives_the_labels_and_embeddings_of_fp32(built):
    """What ``auto`` serves on a CPU with bf16 matrix units (here asked for by name, so
    that it runs on any CPU): the models' checkpoints in bf16, with the hand-written
    sets' labels and entities of fp32 and its embeddings within cosine 0.9999."""
    _, folder = built
    with running_server(folder, dtype="fp32") as url:
        assert {m["dtype"] for m in web.get(url + "/v1/models").json()["data"]} == {"fp32"}
        labels, entities, vectors = _answers(url)
    with running_server(folder, dtype="bf16") as url:
        models = web.get(url + "/v1/models").json()["data"]
        assert {(m["backend"], m["dtype"]) for m in models} == {("torchscript", "bf16")}
        half_labels, half_entities, half_vectors = _answers(url)
    assert half_labels == labels and half_entities == entities
    assert (vectors * half_vectors).sum(-1).min() >= 0.9999  # (unit vectors)
    assert not np.array_equal(vectors, half_vectors)


def test_a_start_on_the_built_default_says_where_it_listens_and_builds_nothing(built,
                                                                               tmp_path):
    cache, _ = built
    port, log = free_port(), tmp_path / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "distilserve.server.cli", "serve", "--port", str(port)], cwd=ROOT,
        env={**os.environ, "DISTILSERVE_CACHE_DIR": str(cache)}, stdout=log.open("w"),
        stderr=subprocess.STDOUT)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", lambda: server.poll() is None, "the server")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    said = log.read_text()
    assert "serving the embedded default\n" in said and "first start" not in said
    assert f"listening on http://127.0.0.1:{port}\n" in said
    assert "no DISTILSERVE_API_KEY" not in said  # loopback: reachable from here only
