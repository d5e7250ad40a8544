"""Sentences written by hand to score the embedded default's models on English that the
generators (distilserve/training/synthetic.py) did not write. Never trained on. They guided the
templates' design (a development set, not a blind test set); the hand-written sentences of
tests/e2e/test_embedded_default.py were kept apart from both.

NER sentences mark their entities inline: ``[PER Tim Cook]``.
"""

from __future__ import annotations

import re

POSITIVE = [
    "I could not put it down.",
    "The kids had a blast and want to go again next summer.",
    "Five stars, the nurse was so patient with my mother.",
    "It arrived a day early and fits perfectly.",
    "The view from the balcony took my breath away.",
    "Easily the smoothest checkout I have used.",
    "Thanks to the new manager the shop feels welcoming again.",
    "My back pain is gone after two weeks with this chair.",
    "The sequel is even better than the original.",
    "We were upgraded to a suite for free, what a treat.",
    "Setup took two minutes and it has run flawlessly since.",
    "The bread was warm, crusty and full of flavour.",
    "Our teacher made algebra feel easy.",
    "I keep recommending this podcast to everyone I know.",
    "Honestly the nicest people I have dealt with in years.",
    "The battery easily lasts the whole weekend.",
    "A gripping story with characters you truly care about.",
    "They fixed the leak quickly and left the kitchen spotless.",
    "The festival was a joyful celebration from start to finish.",
    "This little gadget has saved me so much time.",
]
NEGATIVE = [
    "I want my money back.",
    "The screen cracked the first time I dropped it on the carpet.",
    "We waited an hour and nobody took our order.",
    "Customer service hung up on me twice.",
    "The instructions were impossible to follow.",
    "Cold fries, soggy bun and a sticky table.",
    "The sequel is a lazy cash grab.",
    "After the update the app crashes every time I open it.",
    "Way too loud, I could not sleep at all.",
    "The driver was late and then took the wrong road.",
    "It smelled like mould the moment we walked in.",
    "Two months later the zipper is already broken.",
    "The jokes fell flat and the ending dragged on forever.",
    "They charged my card twice and refused to refund it.",
    "I regret every cent I spent on this subscription.",
    "The paint started peeling within a week.",
    "Nobody answered my emails for three weeks.",
    "The seats were cramped and the air conditioning never worked.",
    "It looks nothing like the pictures online.",
    "Sadly the hotel did not live up to its reputation.",
]
NEUTRAL = [
    "The meeting is at 3 pm.",
    "The library closes at eight on weekdays.",
    "Please send the invoice to the accounts department.",
    "The train to the airport leaves from platform four.",
    "Water boils at one hundred degrees at sea level.",
    "The package weighs about two kilograms.",
    "She ordered a coffee and sat by the window.",
    "The report has twelve chapters and an appendix.",
    "Turn left at the second traffic light.",
    "The store sells shoes, bags and belts.",
    "Our flight was scheduled for Tuesday morning.",
    "The form asks for your name and address.",
    "He moved the boxes into the garage.",
    "The museum is on the north side of the square.",
    "The phone has a six inch screen and two cameras.",
    "Most of the guests arrived by bus.",
    "The recipe calls for two eggs and a cup of flour.",
    "The next update is planned for the spring.",
    "This chapter describes how the engine is assembled.",
    "The survey was sent to four hundred households.",
]
SENTIMENT = [(s, "positive") for s in POSITIVE] + [(s, "negative") for s in NEGATIVE] + [
    (s, "neutral") for s in NEUTRAL]

NER_MARKED = [
    "[PER Jensen Huang] spoke at [ORG Nvidia]'s developer conference in [LOC San Jose].",
    "She bought the phone at the research lab.",
    "Researchers from [ORG Microsoft] and [ORG the University of Oxford] published the study.",
    "[PER Angela Merkel] spoke with [PER Emmanuel Macron] in [LOC Brussels] on Friday.",
    "The committee met on Monday to review the budget.",
    "[ORG Volkswagen] recalled thousands of cars sold in [LOC Mexico] and [LOC Brazil].",
    "According to Dr. [PER Priya Raman], the vaccine trial in [LOC Nairobi] went well.",
    "My sister works for [ORG Unilever] in [LOC Rotterdam].",
    "The Board approved the Annual Report without changes.",
    "[PER Kenji Watanabe] flew from [LOC Osaka] to [LOC Seattle] for the conference.",
    "[ORG Netflix] signed a deal with [ORG Sony Pictures].",
    "Our Sales Team exceeded the Quarterly Target.",
    "[PER Marco] and [PER Giulia] opened a bakery in [LOC Naples].",
    "The river floods every spring.",
    "[ORG The Red Cross] sent supplies to [LOC Haiti] after the storm.",
    "Engineers at [ORG Tesla] tested the battery in [LOC Norway].",
    "Chapter Three explains the Method in detail.",
    "[PER Olivia Bennett] was elected mayor of [LOC Leeds].",
    "Fans lined the streets of [LOC Buenos Aires] to greet [PER Lionel Messi].",
    "The Manager thanked the Staff for their work.",
    "[ORG Samsung] and [ORG LG] compete fiercely in [LOC South Korea].",
    "Last year [PER Ahmed Hassan] left [ORG Shell] to start his own company.",
    "Monday Morning Meetings will start at nine.",
    "The new stadium in [LOC Manchester] was designed by [PER Norman Foster].",
    "Please call the Help Desk if the printer jams.",
    "[ORG Greenpeace] protested outside the parliament in [LOC Oslo].",
    "[PER Sofia Lindqvist] joined [ORG Spotify] as head of design.",
    "We stayed at a small hotel near the beach.",
    "The Prime Minister of [LOC Canada] met workers at a [ORG Ford] plant in [LOC Ontario].",
    "Students at [ORG Harvard University] and [ORG Yale] held a joint debate.",
]
_MARK = re.compile(r"\[(PER|ORG|LOC) ([^\]]+)\]")


def unmark(marked: str) -> tuple[str, list[tuple[int, int, str]]]:
    """The plain sentence and its (start, end, type) character spans."""
    text, spans, pos = "", [], 0
    for m in _MARK.finditer(marked):
        text += marked[pos:m.start()]
        spans.append((len(text), len(text) + len(m.group(2)), m.group(1)))
        text += m.group(2)
        pos = m.end()
    return text + marked[pos:], spans


NER = [unmark(s) for s in NER_MARKED]
