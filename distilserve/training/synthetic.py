"""Training data the project makes offline, seeded and reproducible: sentiment sentences
(negative, neutral, positive) from templates, and NER sentences whose persons,
organisations and locations come from the ``Faker`` package (several locales) and short
lists of well-known names, with common nouns where a name could stand as counter-examples.

Nothing here is downloaded. The held-out parts use the same generators with another seed,
so they measure fitting the templates, not English at large: distilserve/training/handwritten.py
holds sentences written by hand for that.
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
# what happened, without an adjective that gives it away
PRAISE = ["exceeded my expectations", "made my day", "was worth every penny", "was a real pleasure",
          "left me smiling", "impressed everyone", "works like a charm", "was a joy",
          "deserves five stars", "felt like a treat", "was better than I hoped",
          "kept me hooked until the end", "solved my problem in minutes",
          "has not let me down once", "is exactly what I needed", "was over far too soon",
          "had everyone laughing", "runs without a single hiccup", "won me over"]
COMPLAINT = ["was a complete waste of time", "fell apart quickly", "let me down",
             "was a total disaster", "did not work", "ruined my evening", "deserves zero stars",
             "was worse than I feared", "made me angry", "stopped working", "felt like a scam",
             "broke after a week", "never showed up", "cost twice what they promised",
             "kept freezing", "left a mess behind", "gave me a headache",
             "took forever to arrive", "was missing half its parts"]
SENTIMENT_TEMPLATES = [
    "The {thing} {phrase}.", "Honestly, this {thing} {phrase}!", "Our {thing} {phrase}.",
    "The {thing} was not {opposite}.", "I would not call the {thing} {opposite}.",
    "It was not {opposite} at all; the {thing} was {adj}.",
    "The {thing} was {adj}.", "What a {adj} {thing}!", "I found the {thing} {adj}.",
    "This {thing} is {adj}.", "Honestly, the {thing} was really {adj}.", "I {verb} this {thing}.",
    "Overall a {adj} {thing}.", "My {thing} turned out {adj}.", "The {thing} is so {adj}!",
    "Such a {adj} {thing}, {tail}", "We thought the {thing} was {adj}.",
    "I {verb} the {thing} and the {thing2} was {adj} too.", "{tail_cap}",
    "After two weeks, the {thing} {phrase}.",
    "I told my friends that the {thing} {phrase}.",
]
TAILS = {"positive": ["I will come back.", "highly recommended.", "thank you!",
                      "I cannot wait to go back.", "no complaints at all.",
                      "I would buy it again.", "worth the wait."],
         "negative": ["never again.", "avoid it.", "what a waste of money.",
                      "I want a refund.", "nobody helped us.", "I would not recommend it.",
                      "do not bother."]}
# sentences that report without judging, about the same things, so that the words that
# judge, not the topic, decide the class
NEUTRAL_TEMPLATES = [
    "The {thing} is on the {place}.", "I bought the {thing} on {day}.",
    "The {thing} arrived on {day}.", "We talked about the {thing} at lunch.",
    "The {thing} costs {number} dollars.", "Where did you put the {thing}?",
    "The {thing} will be ready at {hour}.", "There is a {thing} in the {place}.",
    "She asked about the {thing} yesterday.", "He is writing a report on the {thing}.",
    "Is the {thing} still available?", "The {thing} was delivered to the {place}.",
    "They moved the {thing} to the {place} last {day}.", "The {thing} has {number} parts.",
    "My brother ordered the same {thing} in {colour}.", "The {event} starts at {hour}.",
    "The {event} was moved to {day}.", "Tickets for the {event} go on sale on {day}.",
    "The {place} is open from {hour} until {hour2}.", "Please bring the {thing} to the {place}.",
    "The {thing} comes in {colour} and {colour2}.", "We need {number} chairs for the {event}.",
    "The {event} lasted about {number} minutes.", "I read about the {thing} in the paper.",
    "He works on the {number}th floor.", "The {thing} was made in {number2}.",
]
PLACES = ["table", "shelf", "front desk", "kitchen", "second floor", "garage", "office",
          "car park", "hallway", "reception", "counter", "library", "station", "post office"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
EVENTS = ["meeting", "lecture", "call", "workshop", "interview", "match", "class",
          "appointment", "briefing", "ceremony", "exam", "rehearsal"]
COLOURS = ["black", "white", "grey", "blue", "green", "red", "silver", "brown"]

SENTIMENT_LABELS = ["negative", "neutral", "positive"]


def sentiment(n: int, seed: int) -> list[tuple[str, int]]:
    """n (sentence, label) pairs, balanced over SENTIMENT_LABELS."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = SENTIMENT_LABELS[i % 3]
        template = rng.choice(NEUTRAL_TEMPLATES if label == "neutral" else SENTIMENT_TEMPLATES)
        positive = label == "positive"
        tail = rng.choice(TAILS[label]) if label != "neutral" else ""
        text = template.format(
            thing=rng.choice(THINGS), thing2=rng.choice(THINGS),
            adj=rng.choice(POSITIVE if positive else NEGATIVE),
            verb=rng.choice(LIKE if positive else DISLIKE),
            phrase=rng.choice(PRAISE if positive else COMPLAINT),
            opposite=rng.choice(NEGATIVE if positive else POSITIVE),
            tail=tail, tail_cap=tail[:1].upper() + tail[1:],
            place=rng.choice(PLACES), day=rng.choice(DAYS), event=rng.choice(EVENTS),
            colour=rng.choice(COLOURS), colour2=rng.choice(COLOURS),
            number=rng.randint(2, 60), number2=rng.randint(1950, 2024),
            hour=f"{rng.randint(1, 12)} {rng.choice(['am', 'pm'])}",
            hour2=f"{rng.randint(1, 12)} {rng.choice(['am', 'pm'])}")
        out.append((text, SENTIMENT_LABELS.index(label)))
    return out


NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
KNOWN_ORGS = ["Google", "Microsoft", "Siemens", "Toyota", "the World Bank", "Amazon",
              "the United Nations", "Deutsche Bahn", "Nestlé", "the BBC", "Airbus", "Oxfam",
              "IBM", "Intel", "Nike", "Pfizer", "Honda", "Ikea", "Reuters", "NASA", "UNESCO",
              "Barclays", "Heineken", "Boeing", "the European Commission", "Interpol"]
KNOWN_PLACES = ["London", "Paris", "Berlin", "New York", "Tokyo", "Madrid", "Rome", "Cairo",
                "Brazil", "Canada", "Kenya", "India", "Sydney", "Lagos", "Vienna", "Peru",
                "Texas", "Bavaria", "Lisbon", "Seoul", "Chile", "Dublin", "Mumbai", "Quebec"]
# organisations named after a place: the place inside is part of the ORG
ORG_PATTERNS = ["the University of {}", "{} University", "{} City Council",
                "{} General Hospital", "the Bank of {}", "{} Football Club", "{} Airport"]
TITLES = ["Dr.", "Professor", "President", "Minister", "Judge", "Senator", "Mr.", "Ms."]
# common nouns where a name could stand: they are not entities
COMMON = {
    "place": ["the research lab", "the office", "a small bakery", "the hospital", "the bank",
              "the airport", "the old town", "the factory", "the beach", "the city centre",
              "a local school", "the head office", "the parliament", "the stadium",
              "a start-up", "the company", "the museum", "the university"],
    "thing": ["the phone", "the battery", "the new printer", "a laptop", "the contract",
              "the report", "the budget", "a vaccine", "the software", "the design"],
    "person": ["My neighbour", "The manager", "A nurse", "The chairman", "Her lawyer",
               "The new engineer", "Our teacher", "The mayor", "A spokesperson",
               "The committee", "The board", "The sales team", "The help desk"],
    "day": DAYS,
}
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
    "We drove through {LOC} on the way to {LOC}.", "Nothing much happened on {day}.",
    # lists of entities are separate entities
    "{ORG} and {ORG} signed a deal in {LOC}.", "Researchers from {ORG} and {ORG} met in {LOC}.",
    "{PER}, {PER} and {PER} joined {ORG}.", "Storms hit {LOC}, {LOC} and {LOC} on {day}.",
    "The company sells its products in {LOC} and {LOC}.",
    # possessives and titles stay outside the entity
    "{ORG}'s new factory in {LOC} opened on {day}.", "We visited {ORG}'s offices in {LOC}.",
    "{PER}'s latest book is about {LOC}.", "{title} {PER} spoke at {ORG} on {day}.",
    "On {day}, {title} {PER} arrived in {LOC}.",
    # the same places in a sentence, filled with common nouns: not entities
    "{person} works at {place} in {LOC}.", "{PER} bought {thing} at {place}.",
    "{person} met {PER} at {place} on {day}.", "{person} left {thing} at {place}.",
    "Engineers at {ORG} tested {thing} in {place}.", "{person} approved {thing} on {day}.",
    "{person} thanked everyone at {place}.", "Workers at {place} in {LOC} went on strike.",
    "{person} will visit {place} on {day}.", "{thing} was delivered to {place} on {day}.",
    # "of" before a place does not make an organisation
    "The mayor of {LOC} opened {place} on {day}.", "The people of {LOC} voted on {day}.",
    "{PER} is the ambassador of {LOC} to {LOC}.",
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

    def full_name():
        return f"{fake.first_name()} {fake.last_name()}"

    def org():
        r = rng.random()
        if r < 0.3:
            return rng.choice(KNOWN_ORGS)
        if r < 0.45:
            return rng.choice(ORG_PATTERNS).format(rng.choice([fake.city, fake.last_name])())
        return fake.company()

    entities = {
        # first and last names, not fake.name(): its titles ("Dr.", "MBA") are not the name
        "PER": lambda: rng.choice([full_name, full_name, fake.last_name, fake.first_name])(),
        "ORG": org,
        "LOC": lambda: rng.choice(KNOWN_PLACES) if rng.random() < 0.3 else
        rng.choice([fake.city, fake.city, fake.country])(),
    }
    others = {slot: lambda words=words: rng.choice(words) for slot, words in COMMON.items()}
    others["title"] = lambda: rng.choice(TITLES)
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
            if kind in entities:
                value = entities[kind]()
                spans.append((len(text), len(text) + len(value), kind))
            else:
                value = others[kind]()
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
