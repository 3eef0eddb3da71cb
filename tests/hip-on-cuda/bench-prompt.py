#!/usr/bin/env python3
"""Writes the speed scripts' prompt file: 64 KB of plain English sentences (over 12k tokens, so both
benches reach their 8192-token frontier), the same bytes on every machine (a fixed seed, no data
files). Usage: bench-prompt.py OUT. Ratios to ds4-bench hold within a run, whatever
the text."""
import random
import sys

rng = random.Random(20261205)
subjects = ["The engineer", "A small robot", "The old librarian", "Our committee", "The river", "A distant star",
            "The compiler", "Every student", "The city council", "A curious cat", "The orchestra",
            "The weather station"]
verbs = ["described", "measured", "ignored", "rebuilt", "questioned", "celebrated", "translated", "compared",
         "painted", "organized", "predicted", "forgot"]
objects = ["the broken bridge", "a quiet afternoon", "the final report", "seven blue lanterns", "the ancient map",
           "an unexpected result", "the winter harvest", "a thousand letters", "the spinning wheel",
           "the morning train", "a secret recipe", "the mountain path"]
tails = ["before sunrise.", "with great care.", "without any warning.", "for the third time.",
         "in the crowded square.", "during the long storm.", "after the meeting ended.", "as the bells rang.",
         "under a pale moon.", "despite the noise."]
out, size = [], 0
while size < 64000:
    s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}"
    if rng.random() < 0.15:
        s += "\n"
    out.append(s)
    size += len(s) + 1
with open(sys.argv[1], "w") as f:
    f.write(" ".join(out) + "\n")
