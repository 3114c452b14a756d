"""One message for many bad inputs, with no torch: a call, a command line or a manifest with several bad inputs
names every one in one line (the first MAX_NAMED, then how many more), so they are fixed in one round."""

from __future__ import annotations

MAX_NAMED = 10  # a message naming more bad inputs than this is too long to read: the rest are counted


def join_named(messages: list[str], more: str = "", limit: int = MAX_NAMED) -> str:
    """`messages` (each naming its input) joined with "; " on one line: the first `limit`, then "and N more"
    followed by `more` (e.g. " bad lines")."""
    named = [" ".join(str(m).split("\n")) for m in messages[:limit]]
    if len(messages) > limit:
        named.append(f"and {len(messages) - limit} more{more}")
    return "; ".join(named)
