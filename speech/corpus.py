"""Open-vocabulary text for the bundled ASR model: sentences from several offline sources, spoken forms normalised.

Sources, all on any machine with Python and the project's dependencies (no download, no apt):

* ``fortunes`` — the committed Debian fortunes list (``text.fortune_sentences``): informal English.
* ``docstrings`` — docstrings of the Python standard library and of installed packages, read with ``ast``
  (nothing is imported): technical English with a broad vocabulary. PSF, BSD, MIT and Apache licensed.
* ``descriptions`` — the long descriptions (PyPI READMEs) in installed distributions' metadata: prose
  about software projects. This source is kept out of training: the out-of-domain test set is drawn from it.

Digits, ordinals, years, money, percentages, a few symbols and common abbreviations become words
(``num2words``), so the synthesizer says what the transcript spells; a sentence that still holds anything
but letters, apostrophes and spaces after that (code, identifiers, URLs, tokens mixing digits and letters,
accented or non-Latin words) is dropped.

What these functions return depends on the installed package versions, so the lists the shipped model was
trained and tested on are committed (``bundled/sentences/open_train.txt.gz``, ``bundled/asr_ood``).
"""

from __future__ import annotations

import ast
import gzip
import importlib.metadata
import os
import random
import re
import sysconfig
from collections.abc import Iterable, Iterator

from .text import normalize_text

BUNDLED_OPEN_TRAIN = os.path.join(os.path.dirname(__file__), "bundled", "sentences", "open_train.txt.gz")

_ABBREVIATIONS = {
    "mr.": "mister", "mrs.": "missus", "ms.": "miss", "dr.": "doctor", "prof.": "professor", "st.": "saint",
    "jr.": "junior", "sr.": "senior", "vs.": "versus", "etc.": "et cetera", "e.g.": "for example",
    "i.e.": "that is", "approx.": "approximately", "no.": "number", "inc.": "incorporated", "ltd.": "limited",
}
_SYMBOLS = {"&": " and ", "%": " percent ", "+": " plus ", "@": " at ", "=": " equals ", "#": " number "}
_ABBREVIATION = re.compile("(?<![A-Za-z])(?:" + "|".join(re.escape(a) for a in sorted(_ABBREVIATIONS, key=len,
                                                                                       reverse=True)) + ")",
                           re.IGNORECASE)  # whole words only: "st." ends "first." too
_MONEY = re.compile(r"\$(\d+)(?:\.(\d\d))?\b")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\b\d+(?:,\d{3})*(?:\.\d+)?\b")
# Anything that marks code, markup or an identifier: the sentence is dropped rather than read out oddly.
_CODE = re.compile(r"[_`<>{}\[\]|\\/*~^]|[A-Za-z]\.[A-Za-z]|\d[A-Za-z]|[A-Za-z]\d|\d\.[A-Za-z]|\w\(|::|>>>"
                   r"|[a-z][A-Z]|\b[A-Z]{2,}\b|https?:|www\.")
_SPEAKABLE = re.compile(r"^[a-z' ]+$")
_TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": " - ",
                              "\u2014": " - ", "\u2026": "...", "\u00a0": " "})


def _spell_number(match: re.Match) -> str:
    from num2words import num2words

    text = match.group(0).replace(",", "")
    if "." in text:
        return f" {num2words(float(text))} "
    value = int(text)
    if 1100 <= value <= 2099 and "," not in match.group(0):  # four digits in that range read as a year
        return f" {num2words(value, to='year')} "
    return f" {num2words(value)} "


def spell_out(text: str) -> str:
    """Numbers, ordinals, years, money, percentages, a few symbols and common abbreviations as words, then
    the scoring normalisation (what ``spoken_form`` does, without refusing anything: for scoring another
    recognizer's output, such as Whisper's digits, against spelled-out references)."""
    from num2words import num2words

    text = " ".join(text.translate(_TYPOGRAPHIC).split())
    text = _ABBREVIATION.sub(lambda m: _ABBREVIATIONS[m.group(0).lower()], text)
    text = _ORDINAL.sub(lambda m: f" {num2words(int(m.group(1)), to='ordinal')} ", text)
    text = _MONEY.sub(lambda m: f" {m.group(1)} dollars " + (f"and {int(m.group(2))} cents " if m.group(2) else ""),
                      text)
    text = _NUMBER.sub(_spell_number, text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, word)
    clean = normalize_text(text.replace("-", " "))
    clean = re.sub(r"(^| )'+|'+( |$)", " ", clean).strip()  # quote marks, not apostrophes
    return " ".join(clean.split())


def spoken_form(text: str) -> str | None:
    """``text`` as words a synthesizer reads the way the transcript spells them, or None if it is not
    plain prose (code, identifiers, markup, URLs, tokens mixing digits and letters, accented or non-Latin
    words)."""
    text = " ".join(text.translate(_TYPOGRAPHIC).split())
    if not text.isascii():  # accented or non-Latin words: the normalisation would cut them into letters
        return None
    # Ordinals and abbreviations first: "2nd" and "e.g." would look like code below.
    checked = _ORDINAL.sub(" ordinal ", _ABBREVIATION.sub(" abbreviation ", text))
    if not text or _CODE.search(checked):  # also tokens mixing digits and letters (2D, S3, mp3, 8.x)
        return None
    clean = spell_out(text)
    return clean if clean and _SPEAKABLE.match(clean) else None


def split_into_sentences(paragraph: str) -> list[str]:
    """Sentence split at ., ! or ? followed by a space and a capital letter (not after an abbreviation)."""
    paragraph = " ".join(paragraph.split())
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z])", paragraph)
    out: list[str] = []
    for part in parts:  # re-join splits that fell after an abbreviation ("Dr. Smith")
        if out and out[-1].split() and _ABBREVIATION.fullmatch(out[-1].split()[-1]):
            out[-1] += " " + part
        else:
            out.append(part)
    return out


def prose_sentences(paragraphs: Iterable[str], min_words: int = 4, max_words: int = 24,
                    max_characters: int = 180) -> Iterator[str]:
    """Speakable sentences of ``paragraphs``: each split, spoken-form normalised, kept within the limits."""
    for paragraph in paragraphs:
        for sentence in split_into_sentences(paragraph):
            if not sentence[:1].isupper() or sentence[-1:] not in ".!?":
                continue  # fragments: headings, list items, clipped text
            spoken = spoken_form(sentence)
            if spoken and min_words <= len(spoken.split()) <= max_words and len(spoken) <= max_characters:
                yield spoken


def _docstring_paragraphs(path: str) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                # Paragraphs end at blank lines; indented blocks (examples, parameter lists) are not prose.
                for block in re.split(r"\n\s*\n", doc):
                    if not block.startswith((" ", "\t")) and ":" not in block.split("\n")[0][-1:]:
                        yield block


def docstring_sentences(roots: Iterable[str] | None = None) -> list[str]:
    """Prose sentences of the docstrings under ``roots`` (default: the standard library and site-packages),
    deduplicated, in a fixed order (sorted file paths)."""
    if roots is None:
        paths = sysconfig.get_paths()
        roots = sorted({paths["stdlib"], paths["purelib"], paths["platlib"]})
    files: set[str] = set()
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in {"test", "tests", "testing", "idle_test", "__pycache__"}]
            files.update(os.path.join(folder, n) for n in names if n.endswith(".py"))
    seen: set[str] = set()
    out: list[str] = []
    for path in sorted(files):
        for sentence in prose_sentences(_docstring_paragraphs(path)):
            if sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
    return out


def description_sentences() -> list[tuple[str, str]]:
    """``(sentence, distribution name)`` from installed distributions' long descriptions (their READMEs),
    deduplicated, in a fixed order (sorted by distribution name)."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    dists = sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower())
    for dist in dists:
        text = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        # Markdown / reStructuredText: keep plain paragraphs, drop headings, lists, tables, code and directives.
        paragraphs = [p for p in re.split(r"\n\s*\n", text)
                      if p.strip() and not p.lstrip().startswith(("#", "-", "*", "|", ">", "..", "=", "!["))
                      and not p.startswith(("    ", "\t"))]
        for sentence in prose_sentences(paragraphs):
            if sentence not in seen:
                seen.add(sentence)
                out.append((sentence, dist.metadata["Name"]))
    return out


def write_sentence_list(path: str, sentences: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(sentences) + "\n")


def read_sentence_list(path: str = BUNDLED_OPEN_TRAIN) -> list[str]:
    """A committed sentence list (one normalised sentence a line, gzip)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def sample_without(sentences: list[str], exclude: set[str], count: int, seed: int) -> list[str]:
    """``count`` sentences not in ``exclude``, drawn with a seeded RNG, in draw order."""
    pool = [s for s in sentences if s not in exclude]
    if count > len(pool):
        raise ValueError(f"count must be at most {len(pool)} (sentences available), got {count}")
    return random.Random(seed).sample(pool, count)
