"""Text side of ASR: the character tokenizer both heads share, and the normalisation WER is scored after.

One vocabulary serves the CTC head and the attention decoder, so a CTC hypothesis is already a decoder
draft (no re-tokenization for the bundled model; the Whisper adapter re-tokenizes text):

    id 0  blank (CTC) / padding (decoder targets never contain it)
    id 1  <s>   decoder start
    id 2  </s>  decoder end
    id 3… the characters ``' abcdefghijklmnopqrstuvwxyz`` (apostrophe, space, a–z)

The corpus text, ``bundled/sentences/fortunes.txt`` (one sentence a line, in ``fortune_sentences`` order), is
what the bundled model was trained on: the Debian bookworm packages fortunes and fortunes-min (1:1.99.1-7.3;
fortunes-off not installed) cleaned by ``fortune_sentences("/usr/share/games/fortunes")``, 18 227 sentences.
It is committed so data generation needs no apt package; the held-out set in ``bundled/asr_test`` is its
``closed_vocabulary_sentences`` split (tests check that).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter

import jiwer

CHARACTERS = "' abcdefghijklmnopqrstuvwxyz"

# WER/CER are computed after this normalisation, applied to references and hypotheses alike: lower case,
# punctuation other than apostrophes removed, whitespace collapsed. It is also what the training text looks
# like, so a perfect model scores 0 on the raw transcripts.
_normalise = jiwer.Compose([
    jiwer.ToLowerCase(),
    jiwer.SubstituteRegexes({r"[^a-z' ]+": " "}),
    jiwer.RemoveMultipleSpaces(),
    jiwer.Strip(),
])


def normalize_text(text: str) -> str:
    """The scoring normalisation (see module docstring)."""
    return _normalise(text)


class CharTokenizer:
    """Characters to ids and back; ``blank_id`` doubles as padding, ``bos_id`` / ``eos_id`` frame decoder text."""

    blank_id = 0
    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, characters: str = CHARACTERS):
        if len(set(characters)) != len(characters):
            raise ValueError(f"characters must be unique, got {characters!r}")
        self.characters = characters
        self._index = {c: i + 3 for i, c in enumerate(characters)}

    @property
    def vocab_size(self) -> int:
        return len(self.characters) + 3

    def encode(self, text: str) -> list[int]:
        """Ids of ``normalize_text(text)``; characters outside the alphabet are dropped by the normalisation."""
        return [self._index[c] for c in normalize_text(text) if c in self._index]

    def decode(self, ids) -> str:
        """Text of ids, stopping at the first ``</s>``; blanks, ``<s>`` and padding are skipped."""
        out = []
        for i in (int(x) for x in ids):
            if i == self.eos_id:
                break
            if i >= 3:
                out.append(self.characters[i - 3])
        return "".join(out)

    def save_pretrained(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "tokenizer.json"), "w") as f:
            json.dump({"type": "characters", "characters": self.characters}, f)

    @classmethod
    def from_pretrained(cls, directory: str) -> "CharTokenizer":
        with open(os.path.join(directory, "tokenizer.json")) as f:
            spec = json.load(f)
        return cls(spec["characters"])


# ---------------------------------------------------------------------------------------------- corpus text
BUNDLED_SENTENCES = os.path.join(os.path.dirname(__file__), "bundled", "sentences", "fortunes.txt")
_SKIP_FILES = {"art", "ascii-art", "perl", "translate-me"}
_ABBREVIATION = re.compile(r"\b(mr|mrs|ms|dr|st|jr|sr|vs|etc|prof|inc|ltd|no)\.|\b[a-z]\.[a-z]\.", re.IGNORECASE)
_ACRONYM = re.compile(r"\b[A-Z]{2,4}\b")
_ATTRIBUTION = re.compile(r"^\s*(--|-|~)\s*\S")
_SPEAKER = re.compile(r"^\s*[A-Za-z .]{1,20}:\s")


def fortune_sentences(directory: str | None = None, min_words: int = 3, max_words: int = 20) -> list[str]:
    """Clean English sentences from the Debian ``fortunes`` files, deduplicated and in a fixed order.

    Without ``directory``, the committed list (see module docstring), of ``min_words``–``max_words`` words; it
    was cleaned with the defaults, so a wider range finds nothing more. With ``directory`` (a fortunes folder
    such as /usr/share/games/fortunes), the cleaning that made the list: attribution lines and speaker labels
    go; a sentence with digits, symbols, a short all-caps acronym or an abbreviation is dropped (espeak-ng
    would read them in ways the transcript cannot show); the rest is normalised to lower-case a–z,
    apostrophes and spaces and kept when it has ``min_words``–``max_words``.
    """
    if directory is None:
        with open(BUNDLED_SENTENCES, encoding="utf-8") as f:
            return [s for s in f.read().splitlines() if min_words <= len(s.split()) <= max_words]
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory} not found: install the Debian packages fortunes and fortunes-min")
    seen, sentences = set(), []
    for name in sorted(os.listdir(directory)):
        if "." in name or name in _SKIP_FILES:
            continue
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
            entries = f.read().split("\n%\n")
        for entry in entries:
            lines = [ln for ln in entry.splitlines() if not _ATTRIBUTION.match(ln)]
            text = " ".join(_SPEAKER.sub(" ", ln) for ln in lines)
            for sentence in re.split(r"(?<=[.!?])\s+", text):
                sentence = sentence.strip()
                if not sentence or re.search(r"[0-9@#$%^&*_=+<>\[\]{}|\\/~`]", sentence):
                    continue
                if _ACRONYM.search(sentence) or _ABBREVIATION.search(sentence):
                    continue
                clean = normalize_text(sentence.replace("-", " "))
                clean = re.sub(r"(^| )'+|'+( |$)", " ", clean).strip()  # quote marks, not apostrophes
                words = clean.split()
                if min_words <= len(words) <= max_words and clean not in seen:
                    seen.add(clean)
                    sentences.append(" ".join(words))
    return sentences


def closed_vocabulary_sentences(num_words: int = 3000) -> list[str]:
    """Fortune sentences whose every word is among the corpus's ``num_words`` most frequent words.

    The bundled model is a closed-vocabulary recogniser: with a few thousand sentences and CPU-hours of
    training, spelling arbitrary words back from espeak's pronunciation is what keeps word error high (see
    asr_feasibility.md), and the speculative comparison needs a model whose AR output is mostly right.
    """
    sentences = fortune_sentences()
    counts = Counter(w for s in sentences for w in s.split())
    vocabulary = {w for w, _ in counts.most_common(num_words)}
    return [s for s in sentences if all(w in vocabulary for w in s.split())]


def split_sentences(sentences: list[str], num_test: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic train/test split by sentence (a sentence never appears in both)."""
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    test = sorted(sentences[i] for i in order[:num_test])
    train = sorted(sentences[i] for i in order[num_test:])
    return train, test
