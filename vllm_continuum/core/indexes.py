"""Two-level indexes (`{key: {member: value}}`), kept without empty inner dicts."""

from __future__ import annotations


def discard(index: dict, key, member) -> None:
    """Drop `member` under `key` if there, and `key` with its last member."""
    inner = index.get(key)
    if inner is not None:
        inner.pop(member, None)
        if not inner:
            del index[key]
