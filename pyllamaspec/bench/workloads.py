"""The prompts a benchmark generates from, and the filler that puts them at a given context depth.

Acceptance depends on what is being written (code drafts well, prose badly) and the cost of a speculative step
grows with the context, so every figure is taken per content class and per depth. The shipped prompt sets live
in ``prompts/<class>.json``; the filler is deterministic so every arm, and every re-run, sees the same tokens.
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from pyllamaspec.errors import ConfigError

CONTENT_CLASSES = ("code", "prose", "reasoning", "edit", "mixed")


@dataclass(frozen=True)
class Prompt:
    id: str
    label: str
    text: str
    content_class: str


def load_prompt_set(content_class: str) -> list[Prompt]:
    """The shipped prompts of one content class."""
    if content_class not in CONTENT_CLASSES:
        raise ConfigError(f"unknown content class {content_class!r}; choose from {', '.join(CONTENT_CLASSES)}")
    document = json.loads((resources.files(__package__) / "prompts" / f"{content_class}.json").read_text())
    return [Prompt(entry["id"], entry["label"], entry["text"], content_class) for entry in document["prompts"]]


# Neutral, self-contained sentences: the filler should occupy context the way a pasted document does, without
# steering the answer or repeating so exactly that n-gram drafters find it trivially.
_FILLER_SENTENCES = (
    "The archive was catalogued over several winters by volunteers who worked from handwritten ledgers.",
    "Each box was given a number, a shelf and a short note describing its contents and condition.",
    "Some ledgers recorded the weather, others the names of visitors who came to consult the maps.",
    "Water damage in the lower rooms meant that many of the oldest papers had to be dried and flattened.",
    "A committee met every second month to decide which collections should be digitised first.",
    "The reading room opened at nine and closed at five, except on public holidays and during inventory.",
    "Requests for copies were answered in the order they arrived, which could take several weeks.",
    "Photographs were stored separately, in acid-free sleeves, at a constant temperature and humidity.",
    "The surveyors' notebooks contained sketches of field boundaries, wells, mills and footpaths.",
    "Researchers were asked to use pencils only and to keep bags and drinks outside the room.",
    "A second index, arranged by parish, was compiled later to make local history easier to trace.",
    "Several volumes were rebound after their spines had cracked from decades of frequent use.",
    "The correspondence files included letters about rents, repairs, disputes and the price of grain.",
    "Maps drawn before the railway arrived show roads that have since disappeared under new fields.",
    "Visitors often asked about the family names carved into the benches of the old meeting hall.",
    "The annual report listed the number of enquiries, new accessions and items lent to exhibitions.",
)


class DepthFiller:
    """Filler text of a requested length in tokens, as counted by the target's tokenizer.

    Text is used rather than token ids so the filler can sit inside the chat template's user message, where a
    pasted document would be, and so external arms that take text receive exactly the same input.
    """

    def __init__(self, count_tokens: Callable[[str], int], seed: int = 0):
        self._count_tokens = count_tokens
        self._baseline = count_tokens("")  # BOS or whatever else the tokenizer adds to any text
        self._rng = random.Random(seed)
        self._pieces: list[str] = []  # words, each with the separator that follows it
        self._texts: dict[int, str] = {}

    def tokens_in(self, text: str) -> int:
        return self._count_tokens(text) - self._baseline

    def _prefix(self, n_pieces: int) -> str:
        return "".join(self._pieces[:n_pieces]).rstrip()

    def _add_paragraph(self) -> None:
        sentences = self._rng.sample(_FILLER_SENTENCES, k=self._rng.randint(3, 6))
        words = " ".join(sentences).split(" ")
        self._pieces += [word + " " for word in words[:-1]] + [words[-1] + "\n\n"]

    def text(self, n_tokens: int) -> str:
        """The longest filler prefix that is at most ``n_tokens`` tokens long (within a word of it)."""
        if n_tokens <= 0:
            return ""
        if n_tokens not in self._texts:
            while self.tokens_in(self._prefix(len(self._pieces))) < n_tokens:
                self._add_paragraph()
            # token counts grow with the prefix, so bisect finds the first prefix that is too long
            too_long = bisect.bisect_right(range(len(self._pieces) + 1), n_tokens,
                                           key=lambda n_pieces: self.tokens_in(self._prefix(n_pieces)))
            self._texts[n_tokens] = self._prefix(too_long - 1)
        return self._texts[n_tokens]


def compose_user_message(prompt_text: str, filler_text: str) -> str:
    """The user turn: the filler as background material, then the task."""
    if not filler_text:
        return prompt_text
    return (f"The following notes are background material and are not needed for the task.\n\n"
            f"{filler_text}\n\nTask: {prompt_text}")
