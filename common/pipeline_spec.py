"""What the command line knows of a pipeline before it loads, with no torch: its `__call__` settings (`--set`
keys with their allowed values), its input flags and how to check their values, and what `--out` may name.

A modality registers one `PipelineSpec` beside each pipeline (`register_pipeline(name, cls, spec=...)`), and the
pipeline class takes its `call_defaults`, input flags and `--out` suffixes from it, so the two cannot drift. With
it, `mmspec generate` answers every mistake it can know of — an unknown or out-of-range `--set`, a flag the
pipeline does not take, a missing or unreadable input file, an `--out` it cannot write — in one line, before
torch or any model loads, and `mmspec generate PLUGIN --help` lists the flags without loading the model.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from .config import config_defaults, make_config
from .errors import join_named

@dataclass(frozen=True)
class InputFlag:
    """One repeatable input flag a pipeline adds to `mmspec generate` (`--audio a.wav --audio b.wav`)."""

    flag: str  # "--audio"
    help: str
    type: type = str
    check: Callable[[object], None] | None = None  # raises ValueError saying what is wrong with one value (no torch)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class PipelineSpec:
    """A pipeline's command-line face. `call_settings` is a dataclass whose fields are the `__call__` settings
    `--set` may change (defaults = the pipeline's `call_defaults`, metadata = allowed values); `bench_settings`
    those only `mmspec bench` takes."""

    modality: str
    call_settings: type
    bench_settings: type | None = None
    inputs: tuple[InputFlag, ...] = ()
    out_suffixes: tuple[str, ...] = ()  # what `--out` may end with ("": a folder); empty: anything
    # The most `mmspec generate --num` may ask for, given the parsed flags: (ceiling, why), or None for no
    # ceiling. No torch: it answers before any model loads.
    num_ceiling: Callable[[argparse.Namespace], tuple[int, str] | None] | None = None

    @property
    def call_defaults(self) -> dict:
        return config_defaults(self.call_settings)

    @property
    def bench_defaults(self) -> dict:
        return config_defaults(self.bench_settings) if self.bench_settings else {}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for item in self.inputs:
            parser.add_argument(item.flag, type=item.type, action="append", default=[], help=item.help)

    def check_settings(self, call: dict, bench: bool = False) -> None:
        """Every call (and with `bench`, bench) setting against its declared values; one line on the first bad one."""
        names = {f.name for f in fields(self.call_settings)}
        make_config(self.call_settings, {k: v for k, v in call.items() if k in names})
        if bench and self.bench_settings:
            names = {f.name for f in fields(self.bench_settings)}
            make_config(self.bench_settings, {k: v for k, v in call.items() if k in names})

    def check_inputs(self, args: argparse.Namespace) -> None:
        """Every value of every input flag checked; one line naming each bad one."""
        bad = []
        for item in self.inputs:
            if item.check is None:
                continue
            for value in getattr(args, item.dest, None) or []:
                try:
                    item.check(value)
                except ValueError as exc:
                    bad.append(f"{item.flag} {value!r}: {exc}")
        if bad:
            raise ValueError(f"{len(bad)} input{'s' if len(bad) != 1 else ''} cannot be used: {join_named(bad)}")

    def check_num(self, args: argparse.Namespace) -> None:
        ceiling = None if self.num_ceiling is None else self.num_ceiling(args)
        if ceiling is not None and args.num > ceiling[0]:
            raise ValueError(f"--num must be at most {ceiling[0]} ({ceiling[1]}), got {args.num}")

    def check_out(self, out: str | None, pipeline_name: str) -> None:
        if out is None or not self.out_suffixes:
            return
        suffix = Path(out).suffix.lower()
        if suffix not in self.out_suffixes:
            names = [s or "a folder (no extension)" for s in self.out_suffixes]
            raise ValueError(f"--out {out!r}: a {pipeline_name} writes {', '.join(names)}; got "
                             f"{suffix or 'no extension'}")


def count_lines(path: str | Path) -> int:
    """Lines of a committed held-out list (its size, read without loading what it names)."""
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def check_file(value) -> None:
    """An input flag's value names an existing file."""
    if not Path(value).exists():
        raise ValueError("no such file")
    if Path(value).is_dir():
        raise ValueError("a folder, not a file")
