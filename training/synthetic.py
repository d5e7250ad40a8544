"""Training data the project makes offline, seeded and reproducible: sentiment sentences
from templates, and NER sentences whose persons, organisations and locations come from
the ``Faker`` package (several locales) and a short list of well-known names.

Nothing here is downloaded. The held-out parts use the same generators with another seed,
so they measure fitting the templates, not English at large: the tests and the issue note
add hand-written sentences for that.
"""

from __future__ import annotations

import random

POSITIVE = ["great", "excellent", "wonderful", "fantastic", "amazing", "superb", "delightful",
            "lovely", "brilliant", "outstanding", "pleasant", "impressive", "perfect",
            "enjoyable", "good", "awesome", "terrific", "charming", "beautiful", "fun"]
NEGATIVE = ["terrible", "awful", "horrible", "dreadful", "disappointing", "poor", "bad",
            "useless", "rude", "boring", "mediocre", "disgusting", "frustrating", "annoying",
            "unpleasant", "slow", "ugly", "broken", "overpriced", "painful"]
LIKE = ["love", "adore", "really enjoyed", "would recommend", "am happy with", "liked"]
DISLIKE = ["hate", "regret buying", "returned", "cannot stand", "am unhappy with", "disliked"]
THINGS = ["movie", "film", "book", "restaurant", "meal", "hotel", "service", "product", "phone",
          "laptop", "concert", "show", "app", "game", "coffee", "staff", "experience", "trip",
          "course", "song", "album", "car", "room", "pizza", "update", "delivery", "team",
          "camera", "headphones", "museum"]
PRAISE = ["exceeded my expectations", "made my day", "was worth every penny", "was a real pleasure",
          "left me smiling", "impressed everyone", "works like a charm", "was a joy",
          "deserves five stars", "felt like a treat", "was better than I hoped"]
COMPLAINT = ["was a complete waste of time", "fell apart quickly", "let me down",
             "was a total disaster", "did not work", "ruined my evening", "deserves zero stars",
             "was worse than I feared", "made me angry", "stopped working", "felt like a scam"]
SENTIMENT_TEMPLATES = [
    "The {thing} {phrase}.", "Honestly, this {thing} {phrase}!", "Our {thing} {phrase}.",
    "The {thing} was not {opposite}.", "I would not call the {thing} {opposite}.",
    "It was not {opposite} at all; the {thing} was {adj}.",
    "The {thing} was {adj}.", "What a {adj} {thing}!", "I found the {thing} {adj}.",
    "This {thing} is {adj}.", "Honestly, the {thing} was really {adj}.", "I {verb} this {thing}.",
    "Overall a {adj} {thing}.", "My {thing} turned out {adj}.", "The {thing} is so {adj}!",
    "Such a {adj} {thing}, {tail}", "We thought the {thing} was {adj}.",
    "I {verb} the {thing} and the {thing2} was {adj} too.",
]
TAILS = {"positive": ["I will come back.", "highly recommended.", "thank you!"],
         "negative": ["never again.", "avoid it.", "what a waste of money."]}

SENTIMENT_LABELS = ["negative", "positive"]


def sentiment(n: int, seed: int) -> list[tuple[str, int]]:
    """n (sentence, label) pairs, balanced; label 1 is positive."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        positive = i % 2 == 1
        out.append((rng.choice(SENTIMENT_TEMPLATES).format(
            thing=rng.choice(THINGS), thing2=rng.choice(THINGS),
            adj=rng.choice(POSITIVE if positive else NEGATIVE),
            verb=rng.choice(LIKE if positive else DISLIKE),
            phrase=rng.choice(PRAISE if positive else COMPLAINT),
            opposite=rng.choice(NEGATIVE if positive else POSITIVE),
            tail=rng.choice(TAILS["positive" if positive else "negative"])), int(positive)))
    return out


NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
KNOWN_ORGS = ["Google", "Microsoft", "Siemens", "Toyota", "the World Bank", "Amazon",
              "the United Nations", "Deutsche Bahn", "Nestlé", "the BBC", "Airbus", "Oxfam"]
KNOWN_PLACES = ["London", "Paris", "Berlin", "New York", "Tokyo", "Madrid", "Rome", "Cairo",
                "Brazil", "Canada", "Kenya", "India", "Sydney", "Lagos", "Vienna", "Peru"]
NER_TEMPLATES = [
    "{PER} works at {ORG} in {LOC}.", "{PER} visited {LOC} last week.",
    "{ORG} opened a new office in {LOC}.", "Yesterday, {PER} met {PER} in {LOC}.",
    "{PER}, the chief executive of {ORG}, said the company would expand to {LOC}.",
    "The headquarters of {ORG} are in {LOC}.", "{PER} moved from {LOC} to {LOC} in 2019.",
    "According to {PER}, {ORG} is hiring engineers.", "I had lunch with {PER} in {LOC}.",
    "{ORG} announced that {PER} will join its board.", "She flew to {LOC} to meet {PER}.",
    "Shares of {ORG} rose after {PER} spoke in {LOC}.", "{PER} left {ORG} after ten years.",
    "Officials in {LOC} praised {ORG} for the project.", "Have you ever been to {LOC}?",
    "My friend {PER} studies history.", "The weather in {LOC} was cold and rainy.",
    "A spokesperson for {ORG} declined to comment.", "{PER} and {PER} founded {ORG}.",
    "We drove through {LOC} on the way to {LOC}.", "Nothing much happened on Sunday.",
]


def _faker(seed: int):
    from faker import Faker

    fake = Faker(["en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT"])
    fake.seed_instance(seed)
    # it_IT builds its list of cities from a set, whose order follows the process's string
    # hashing (random per process): sorted, the same seed gives the same data in every run
    for factory in fake.factories:
        for provider in factory.providers:
            if isinstance(getattr(provider, "cities", None), list):
                provider.cities = sorted(provider.cities)
    return fake


def ner(n: int, seed: int) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """n (sentence, [(start, end, type)]) with character spans, types PER, ORG, LOC."""
    rng, fake = random.Random(seed), _faker(seed)
    fillers = {
        "PER": lambda: rng.choice([fake.name, fake.name, fake.last_name, fake.first_name])(),
        "ORG": lambda: rng.choice(KNOWN_ORGS) if rng.random() < 0.3 else fake.company(),
        "LOC": lambda: rng.choice(KNOWN_PLACES) if rng.random() < 0.3 else
        rng.choice([fake.city, fake.city, fake.country])(),
    }
    out = []
    for _ in range(n):
        template, text, spans, pos = rng.choice(NER_TEMPLATES), "", [], 0
        while True:
            start = template.find("{", pos)
            if start < 0:
                text += template[pos:]
                break
            end = template.index("}", start)
            kind = template[start + 1:end]
            text += template[pos:start]
            value = fillers[kind]()
            spans.append((len(text), len(text) + len(value), kind))
            text += value
            pos = end + 1
        if text[0].islower():
            text = text[0].upper() + text[1:]
        out.append((text, spans))
    return out


def token_labels(offsets: list[tuple[int, int]], special: list[int],
                 spans: list[tuple[int, int, str]]) -> list[int]:
    """BIO label ids per token from character spans; -100 for special tokens."""
    labels = []
    for (start, end), is_special in zip(offsets, special):
        if is_special or start == end:
            labels.append(-100)
            continue
        tag = "O"
        for s, e, kind in spans:
            if s <= start < e:
                tag = ("B-" if start == s else "I-") + kind
                break
        labels.append(NER_LABELS.index(tag))
    return labels
