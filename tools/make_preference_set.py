"""Write evals/data/preference.jsonl: gptlab's own preference pairs for DPO, from checkable facts.

    python tools/make_preference_set.py            # rewrites the file; the same bytes every time

Every pair asks a question whose answer is a fact computed or listed here (sums, products,
differences, capitals, opposites, plurals, letters of a word, the day after a day). The chosen
answer is polite, correct and one sentence; the rejected one is, in turn, wrong (a near miss: an
off-by-some number, another capital, a wrong word), rude (the right fact, said with contempt) or
rambling (the right fact, buried in filler). A record's ``split`` pins it to ``train`` or ``val``:
the held-out pairs ask about facts the training pairs never do (other numbers, other countries,
other words), so held-out reward accuracy measures what DPO learnt, not what it memorised.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "evals" / "data" / "preference.jsonl"
TRAIN, VAL = 300, 60

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Greece": "Athens",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Poland": "Warsaw",
    "Ireland": "Dublin",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Hungary": "Budapest",
    "Chile": "Santiago",
    "Argentina": "Buenos Aires",
    "Mexico": "Mexico City",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Turkey": "Ankara",
    "Russia": "Moscow",
    "China": "Beijing",
    "India": "New Delhi",
    "Australia": "Canberra",
    "Brazil": "Brasilia",
    "Cuba": "Havana",
    "Belgium": "Brussels",
    "Switzerland": "Bern",
    "Iceland": "Reykjavik",
    "Morocco": "Rabat",
    "Ghana": "Accra",
    "Colombia": "Bogota",
    "Indonesia": "Jakarta",
    "South Korea": "Seoul",
    "Netherlands": "Amsterdam",
}
OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "fast": "slow",
    "happy": "sad",
    "light": "dark",
    "early": "late",
    "open": "closed",
    "full": "empty",
    "high": "low",
    "strong": "weak",
    "young": "old",
    "wet": "dry",
    "loud": "quiet",
    "hard": "soft",
    "rich": "poor",
    "thick": "thin",
    "near": "far",
    "clean": "dirty",
    "first": "last",
    "true": "false",
    "up": "down",
    "inside": "outside",
    "win": "lose",
    "buy": "sell",
}
PLURALS = {
    "child": "children",
    "mouse": "mice",
    "tooth": "teeth",
    "foot": "feet",
    "man": "men",
    "woman": "women",
    "goose": "geese",
    "person": "people",
    "knife": "knives",
    "leaf": "leaves",
    "box": "boxes",
    "city": "cities",
    "baby": "babies",
    "wolf": "wolves",
    "bus": "buses",
    "fish": "fish",
    "sheep": "sheep",
    "potato": "potatoes",
    "hero": "heroes",
    "cactus": "cacti",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
WORDS = [
    "apple",
    "river",
    "garden",
    "planet",
    "window",
    "pencil",
    "guitar",
    "orange",
    "castle",
    "bridge",
    "forest",
    "rocket",
    "candle",
    "silver",
    "butter",
    "jacket",
    "marble",
    "tunnel",
]

RUDE = [
    "Ugh, obviously {fact}. Look it up yourself next time.",
    "Seriously? {fact}. Even a child knows that.",
    "{fact}. Stop wasting my time with such easy questions.",
    "Fine, {fact}. What a pointless thing to ask.",
    "Are you kidding? {fact}. Try thinking before you ask.",
]
RAMBLING = [
    "Well, that is a really interesting question, and there are many ways one could think about it, "
    "and people have thought about things like this for a very long time, so after considering it "
    "from several angles and going back and forth a little, I would say that {fact}, more or less.",
    "Hmm, let me think about this for a while, because it is the kind of question that deserves some "
    "care, and I want to be thorough and not rush anything, so, taking everything into account and "
    "with all of that said, it seems that {fact}, if I am not mistaken.",
    "So, first of all, thank you for asking, and before I answer I want to mention that questions "
    "like this come up a lot, and it is good to be curious, and anyway, to get to the point "
    "eventually, {fact}, I believe, although one could say more.",
]
POLITE = ["{Fact}.", "Sure! {Fact}.", "Good question: {fact}.", "{Fact}. Happy to help!"]


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


Fact = tuple[str, str, str]  # (question, the correct fact, a wrong fact in the same words)


def arithmetic(rng: random.Random, held: bool) -> Fact:
    op = rng.choice("+-*")
    lo, hi = (50, 99) if held else (2, 49)  # held-out questions use numbers training never sees
    a, b = rng.randint(lo, hi), rng.randint(2, 12 if op == "*" else hi)
    if op == "-":
        a, b = max(a, b), min(a, b)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    wrong = value + rng.choice([-10, -2, -1, 1, 2, 10])
    sym = {"+": "+", "-": "-", "*": "×"}[op]
    return f"What is {a} {sym} {b}?", f"{a} {sym} {b} = {value}", f"{a} {sym} {b} = {wrong}"


def _pick(rng: random.Random, table: dict[str, str], held: bool) -> tuple[str, str, str]:
    keys = sorted(table)
    cut = len(keys) * 3 // 4  # the last quarter (alphabetically) is held out
    key = rng.choice(keys[cut:] if held else keys[:cut])
    other = rng.choice([k for k in keys if table[k] != table[key]])
    return key, table[key], table[other]


def capital(rng: random.Random, held: bool) -> Fact:
    country, city, wrong = _pick(rng, CAPITALS, held)
    return (
        f"What is the capital of {country}?",
        f"the capital of {country} is {city}",
        f"the capital of {country} is {wrong}",
    )


def opposite(rng: random.Random, held: bool) -> Fact:
    word, opp, wrong = _pick(rng, OPPOSITES, held)
    return (
        f"What is the opposite of '{word}'?",
        f"the opposite of '{word}' is '{opp}'",
        f"the opposite of '{word}' is '{wrong}'",
    )


def plural(rng: random.Random, held: bool) -> Fact:
    word, plu, _ = _pick(rng, PLURALS, held)
    wrong = word + "s" if plu != word + "s" else word + "es"
    return (
        f"What is the plural of '{word}'?",
        f"the plural of '{word}' is '{plu}'",
        f"the plural of '{word}' is '{wrong}'",
    )


def next_day(rng: random.Random, held: bool) -> Fact:
    i = rng.choice([5, 6] if held else [0, 1, 2, 3, 4])
    right, wrong = DAYS[(i + 1) % 7], DAYS[(i + 2) % 7]
    return (
        f"Which day comes after {DAYS[i]}?",
        f"{right} comes after {DAYS[i]}",
        f"{wrong} comes after {DAYS[i]}",
    )


def letters(rng: random.Random, held: bool) -> Fact:
    word = rng.choice(WORDS[12:] if held else WORDS[:12])
    n = len(word)
    return (
        f"How many letters are in the word '{word}'?",
        f"'{word}' has {n} letters",
        f"'{word}' has {n + rng.choice([-1, 1, 2])} letters",
    )


KINDS: list[Callable[[random.Random, bool], Fact]] = [
    arithmetic,
    capital,
    opposite,
    plural,
    next_day,
    letters,
]


def make_pairs(n: int, held: bool, seed: int) -> list[dict[str, str]]:
    """``n`` distinct preference pairs; ``held``: from the held-out facts."""
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str, str]] = set()
    while len(out) < n:
        question, fact, wrong = KINDS[len(out) % len(KINDS)](rng, held)
        flaw = ("wrong", "rude", "rambling")[(len(out) // len(KINDS)) % 3]
        polite = rng.choice(POLITE)
        chosen = polite.format(fact=fact, Fact=_cap(fact))
        if flaw == "wrong":  # the same words around another fact: only the fact differs
            rejected = polite.format(fact=wrong, Fact=_cap(wrong))
        elif flaw == "rude":
            rejected = _cap(rng.choice(RUDE).format(fact=fact))
        else:
            rejected = rng.choice(RAMBLING).format(fact=fact)
        if (question, chosen, rejected) in seen:  # every pair once
            continue
        seen.add((question, chosen, rejected))
        out.append(
            {
                "prompt": question,
                "chosen": chosen,
                "rejected": rejected,
                "flaw": flaw,
                "split": "val" if held else "train",
            }
        )
    return out


def main() -> None:
    pairs = make_pairs(TRAIN, held=False, seed=0) + make_pairs(VAL, held=True, seed=1)
    OUT.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")
    print(f"{OUT.name}: {TRAIN} train + {VAL} held-out pairs")


if __name__ == "__main__":
    main()
