"""Loading the small trained add-ons plugins draft with (EAGLE heads, spatial heads, ...)."""

from __future__ import annotations

import os
from pathlib import Path


def load_head(cls, path: str | os.PathLike, field: str):
    """`cls.from_pretrained(path)` in eval mode; a missing folder is an error naming the config `field`."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise ValueError(f"{field} {str(path)!r} is not a saved head folder (no config.json there)")
    return cls.from_pretrained(path).eval()
