"""Generate the OCR prompt set: scene templates x short target texts, one quoted target each.

    python datasets/make_ocr_prompts.py                  # writes datasets/ocr/{train,test}.txt
    python datasets/make_ocr_prompts.py --out-dir /tmp/ocr --seed 0

Deterministic: the same seed writes byte-identical files. Train and test use disjoint target
texts. Every prompt holds exactly one pair of double quotes around its target (the OCR reward
reads the text between the first pair).
"""

from __future__ import annotations

import random
from pathlib import Path

from prompt_io import generator_main

TEMPLATES = (
    'A storefront sign that says "{t}"',
    'A neon sign glowing on a brick wall that reads "{t}"',
    'A chalkboard menu outside a cafe with the words "{t}" written in white chalk',
    'A vintage travel poster with the headline "{t}"',
    'A white coffee mug printed with the words "{t}"',
    'A black T-shirt with the slogan "{t}" across the chest',
    'A green highway road sign that reads "{t}"',
    'A birthday cake with "{t}" written in icing',
    'A hardcover book lying on a wooden table, its cover titled "{t}"',
    'A wooden signpost at a hiking trail carved with "{t}"',
    'A cardboard protest sign held up in a crowd that says "{t}"',
    'A movie theater marquee showing "{t}"',
    'A handwritten sticky note on a laptop screen saying "{t}"',
    'A red fire truck with "{t}" painted on its side',
    'A billboard above a city street advertising "{t}"',
    'A doormat in front of a blue door that says "{t}"',
    'A glass bottle with a paper label that reads "{t}"',
    'A graffiti mural on a concrete wall spelling "{t}"',
    'A license plate on an old car that reads "{t}"',
    'A banner hanging over a school gym entrance reading "{t}"',
    'A street-food truck with a painted sign saying "{t}"',
    'A computer screen showing a terminal window with the text "{t}"',
    'A tote bag with "{t}" printed in bold letters',
    'A hand-lettered wedding sign that says "{t}"',
    'A museum plaque engraved with "{t}"',
)


def _words(text: str) -> tuple[str, ...]:
    """Whitespace-separated words of a block of text, in order."""
    return tuple(text.split())


WORDS = _words(
    """
    OPEN CLOSED SALE EXIT WELCOME BAKERY COFFEE PIZZA TACOS SUSHI BOOKS MUSIC GARDEN LIBRARY
    HOTEL MOTEL DINER BAR MARKET PHARMACY TICKETS PARKING STOP YIELD DETOUR HELLO GOODBYE
    THANKS CHEERS DREAM HOPE PEACE LOVE FOCUS RELAX EXPLORE CREATE BELIEVE IMAGINE SUNRISE
    SUNSET THUNDER GALAXY ROCKET ORBIT PIXEL ROBOT CIRCUIT VELVET MEADOW HARBOR CANYON
    GLACIER VOLCANO LANTERN COMPASS ANCHOR FALCON TIGER PANDA OTTER LEMON MANGO CHERRY
    PEPPER HONEY WAFFLE NOODLE BAGEL DONUT CANDY PICNIC SAFARI VOYAGE JOURNEY MARATHON
    CHAMPION VICTORY ENCORE BRAVO JACKPOT BINGO KARAOKE DISCO JAZZ
    """
)

ADJECTIVES = _words(
    """
    FRESH HOT COLD BIG TINY GOLDEN SILVER WILD QUIET LUCKY HAPPY SUNNY COSMIC URBAN RETRO
    MIDNIGHT OPEN FREE GRAND SECRET SWEET SPICY CRAZY MAGIC NORTH SOUTH ROYAL SIMPLE DAILY
    FOREVER
    """
)

NOUNS = _words(
    """
    BREAD COFFEE PIZZA DEALS GARDEN KITCHEN STUDIO MARKET BAKERY BOOKS RECORDS TACOS CAFE
    DINER THEATER CINEMA MUSEUM HARBOR BRIDGE ROAD STREET AVENUE PARK BEACH ISLAND FOREST
    RIVER CASTLE CLUB LOUNGE GARAGE WORKSHOP TRAIN RADIO ARCADE CANDY DREAMS NIGHTS LATE
    SALE
    """
)

NUMBERED = _words(
    """
    ROUTE GATE ROOM PLATFORM EXIT STUDIO AISLE LEVEL
    """
)

NUM_TEST_TARGETS = 40
NUM_TRAIN_TARGETS = 400
TEMPLATES_PER_TARGET = 5


def target_pool() -> list[str]:
    """Every candidate target text, sorted (so sampling depends only on the seed)."""
    pool = set(WORDS)
    pool.update(f"{a} {n}" for a in ADJECTIVES for n in NOUNS if a != n)
    pool.update(f"{w} {k}" for w in NUMBERED for k in (1, 2, 7, 9, 12, 24, 42, 66, 101))
    return sorted(t for t in pool if len(t) <= 16)


def styled(target: str, rng: random.Random) -> str:
    """Upper case for two thirds of targets, Title Case for the rest (OCR is case-blind)."""
    return target if rng.random() < 2 / 3 else target.title()


def make_prompts(seed: int) -> tuple[list[str], list[str]]:
    """Returns ``(train, test)`` prompt lines; test targets are disjoint from train targets."""
    rng = random.Random(seed)
    pool = target_pool()
    rng.shuffle(pool)
    needed = NUM_TEST_TARGETS + NUM_TRAIN_TARGETS
    if len(pool) < needed:
        raise ValueError(f"target pool has {len(pool)} texts; need {needed}")
    test_targets = pool[:NUM_TEST_TARGETS]
    train_targets = pool[NUM_TEST_TARGETS:needed]

    def expand(targets: list[str]) -> list[str]:
        lines = []
        for target in targets:
            for template in rng.sample(TEMPLATES, TEMPLATES_PER_TARGET):
                lines.append(template.format(t=styled(target, rng)))
        rng.shuffle(lines)
        return lines

    return expand(train_targets), expand(test_targets)


def main(argv: list[str] | None = None) -> list[Path]:
    return generator_main(
        argv,
        description=__doc__.splitlines()[0],
        default_dir=Path(__file__).resolve().parent / "ocr",
        build=lambda seed: dict(zip(("train.txt", "test.txt"), make_prompts(seed))),
    )


if __name__ == "__main__":
    main()
