"""locust scenarios: embed, classify and ner users sending single sentences.

Run by ``python -m loadtests.run`` against a service it starts on 127.0.0.1; to run by
hand: ``locust -f loadtests/locustfile.py --headless -u 8 -r 8 -t 10s --host http://127.0.0.1:8000``.
Each route's model is the one served for its task (DISTILSERVE_LOAD_* to choose)."""

import os
import random

import gevent
from locust import FastHttpUser, between, events, task

SENTENCES = [
    "The service was quick and the staff were friendly.",
    "Angela Merkel met Emmanuel Macron in Paris on Tuesday.",
    "My order arrived late and the box was damaged.",
    "Apple opened a new office in Munich last year.",
    "How do I reset my password?",
    "The weather in London was cold and rainy all week.",
]
KEY = os.environ.get("DISTILSERVE_API_KEY", "").strip()  # as the service reads it
HEADERS = {"Authorization": f"Bearer {KEY}"} if KEY else {}


@events.init.add_listener
def _read_the_clock(**_):
    """gevent's loop reads the clock only as it turns, and -t's timer counts from its last
    reading: locust's start-up, slow on a busy machine, came off the run (2 of a 3 s run
    under load; all of it once: no requests)."""
    gevent.get_hub().loop.update_now()


def _body(key: str, **extra):
    body = {"inputs": random.choice(SENTENCES), **extra}
    if os.environ.get(key):
        body["model"] = os.environ[key]
    return body


class EmbedUser(FastHttpUser):
    wait_time = between(0, 0.01)

    @task
    def embed(self):
        self.client.post("/v1/embed", json=_body("DISTILSERVE_LOAD_EMBED"), headers=HEADERS)


class ClassifyUser(FastHttpUser):
    wait_time = between(0, 0.01)

    @task
    def classify(self):
        self.client.post("/v1/classify", json=_body("DISTILSERVE_LOAD_CLASSIFY"),
                         headers=HEADERS)


class NerUser(FastHttpUser):
    wait_time = between(0, 0.01)

    @task
    def ner(self):
        self.client.post("/v1/ner", json=_body("DISTILSERVE_LOAD_NER"), headers=HEADERS)
