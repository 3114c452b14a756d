"""A `mmspec batch` manifest read and checked line by line, with no torch (so its mistakes answer before torch
loads): one JSON object per line in a pipeline's input terms, with optional `id` and `seed`. Every bad line is
named in one error, with its line number."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import join_named

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RESERVED_FIELDS = ("id", "seed")


@dataclass
class Sample:
    index: int  # 0-based position in the manifest
    line: int  # 1-based line number (for errors)
    id: str
    seed: int
    fields: dict  # the pipeline's input fields as written in the manifest
    input: object = None  # the pipeline's checked input (`batch_input`)


def read_manifest(path: str | os.PathLike, seed: int) -> list[Sample]:
    """Parse the manifest's lines (JSON syntax, `id`, `seed`); the pipeline checks its own fields after."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--inputs: no such manifest file: {str(path)!r}")
    samples, seen, errors = [], {}, []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        # A bad line keeps its index: the lines after it get the default ids and seeds they will have once it
        # is fixed, so no error here is an artefact of another.
        try:
            samples.append(read_line(text, number, len(samples) + len(errors), seed, seen))
        except ValueError as exc:
            errors.append(f"{path.name} line {number}: {exc}")
    check_lines(errors)
    if not samples:
        raise ValueError(f"--inputs: {str(path)!r} has no samples (one JSON object per line)")
    return samples


def read_line(text: str, number: int, index: int, seed: int, seen: dict) -> Sample:
    """One manifest line (the `index`-th sample) -> its Sample; ValueError saying what is wrong with it.
    seen: the ids of the lines before, with their line numbers (this one's is added)."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"must be a JSON object, got {type(record).__name__}")
    sample_id = record.get("id", f"{index:06d}")
    if not isinstance(sample_id, (str, int)) or isinstance(sample_id, bool) \
            or not ID_PATTERN.fullmatch(str(sample_id)):
        raise ValueError("field 'id' must be a string of letters, digits, '.', '_' or '-' (1-100 characters, not "
                         f"starting with a symbol), got {sample_id!r}")
    sample_id = str(sample_id)
    if sample_id in seen:
        raise ValueError(f"field 'id' {sample_id!r} repeats line {seen[sample_id]}")
    seen[sample_id] = number
    sample_seed = record.get("seed", seed + index)
    if isinstance(sample_seed, bool) or not isinstance(sample_seed, int) or not 0 <= sample_seed < 2 ** 63:
        raise ValueError(f"field 'seed' must be an int in [0, 2**63), got {sample_seed!r}")
    fields = {k: v for k, v in record.items() if k not in RESERVED_FIELDS}
    return Sample(index, number, sample_id, sample_seed, fields)


def check_lines(errors: list[str]) -> None:
    """One ValueError naming every bad line ("m.jsonl line N: ..."; `join_named`), or nothing when there are none."""
    if errors:
        raise ValueError(join_named(errors, more=" bad lines"))


def path_field(record: dict, field: str, base_dir: Path, what: str) -> str:
    """A manifest field naming an existing file (relative paths are under the manifest's folder)."""
    value = record.get(field)
    if value is None:
        raise ValueError(f"field {field!r} is missing ({what})")
    if not isinstance(value, str) or not value:
        raise ValueError(f"field {field!r} must be a file path string ({what}), got {value!r}")
    path = Path(value) if Path(value).is_absolute() else Path(base_dir) / value
    if not path.is_file():
        raise ValueError(f"field {field!r}: no such file {str(path)!r}")
    return str(path)


def text_field(record: dict, field: str, what: str) -> str:
    value = record.get(field)
    if value is None:
        raise ValueError(f"field {field!r} is missing ({what})")
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field {field!r} must be a non-empty string ({what}), got {value!r}")
    return value
