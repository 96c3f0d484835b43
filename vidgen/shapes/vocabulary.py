"""The words the default model knows, and a warning for prompts that go beyond them.

The embedded model was trained on Shapes World captions only, so a prompt such as "a cat playing
the piano" gives a blob: :func:`prompt_warning` names the words it does not know and says what it
does understand. The vocabulary is built from the same tables and templates the captions are
written from, so it follows them.
"""

from __future__ import annotations

import re
import string

from vidgen.shapes.captions import HELD_OUT_TEMPLATES, TRAINING_TEMPLATES
from vidgen.shapes.prompts import (
    _BACKGROUND_NOUNS,
    _COLOR_TOKENS,
    _DIRECTION_TOKENS,
    _SHAPE_TOKENS,
    _SIZE_TOKENS,
    _SPEED_TOKENS,
    BACKGROUND_WORDS,
    SIZE_WORDS,
    SPEED_ADJECTIVES,
    SPEED_ADVERBS,
    VERBS,
    direction_phrases,
    parse_prompt,
)
from vidgen.shapes.world import BACKGROUNDS, COLORS, DIRECTIONS, SHAPES, SIZES, SPEEDS

# words of the captions' fixed phrases ("on a plain black backdrop", "in front of", "we see")
_PHRASE_WORDS = (
    "a an one the on over against in front of plain across with that there is it as and we see "
    "watch video keeps around about at low high speed pace sized mid diagonally toward towards to"
)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def _known_words() -> frozenset[str]:
    words = _words(_PHRASE_WORDS)
    for table in (_SHAPE_TOKENS, _SIZE_TOKENS, _SPEED_TOKENS, _COLOR_TOKENS, _DIRECTION_TOKENS):
        words |= set(table)
    words |= _BACKGROUND_NOUNS
    for table in (SIZE_WORDS, SPEED_ADJECTIVES, SPEED_ADVERBS, BACKGROUND_WORDS):
        for phrases in table.values():
            words |= _words(" ".join(phrases))
    words |= _words(" ".join(" ".join(pair) for pair in VERBS))
    for direction in DIRECTIONS:
        words |= _words(" ".join(direction_phrases(direction)))
    for template in TRAINING_TEMPLATES + HELD_OUT_TEMPLATES:
        fixed = "".join(literal for literal, *_ in string.Formatter().parse(template))
        words |= _words(fixed)
    return frozenset(words)


KNOWN_WORDS = _known_words()
"""Every word of every caption the default model was trained or evaluated on."""

UNDERSTANDS = (
    f"colours ({', '.join(COLORS)}), shapes ({', '.join(SHAPES)}), sizes ({', '.join(SIZES)}), "
    f"speeds ({', '.join(SPEEDS)}), directions ({', '.join(DIRECTIONS)}) and backgrounds "
    f"({', '.join(BACKGROUNDS)}), e.g. 'a small fast red circle moving left on a black background'"
)
"""What the default model understands, in words."""


def unknown_words(prompt: str) -> list[str]:
    """The prompt's words that no Shapes World caption uses, in order, each once."""
    seen: list[str] = []
    for word in re.findall(r"[a-z]+", prompt.lower()):
        if word not in KNOWN_WORDS and word not in seen:
            seen.append(word)
    return seen


def prompt_warning(prompt: str) -> str | None:
    """None for a prompt the default model understands; otherwise what it will not understand
    (the unknown words, or what the prompt lacks) and what it does."""
    unknown = unknown_words(prompt)
    if unknown:
        listed = ", ".join(repr(w) for w in unknown)
        return (
            f"the default model only knows Shapes World and does not know {listed} in {prompt!r}; "
            f"it understands {UNDERSTANDS}"
        )
    try:
        parse_prompt(prompt)
    except ValueError as err:
        return f"the default model cannot read this prompt fully: {err}"
    return None
