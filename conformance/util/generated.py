"""Blocks of a document generated from the project's data, between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->``: each fact (a clause's promise, a connector's known failure) is written once,
in its data, and the documents show it. ``scripts/render_tables.py`` rewrites the blocks; the
project's tests fail while one is stale."""

from __future__ import annotations


def markers(name: str) -> tuple[str, str]:
    """The lines that open and close the block ``name``."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def current_block(text: str, name: str) -> str:
    """What ``text`` holds between the block's markers (ValueError unless each is there once, in order)."""
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.find(end) < text.find(begin + "\n"):
        raise ValueError(f"one {begin} ... {end} block is needed, its markers on lines of their own")
    start = text.find(begin + "\n") + len(begin) + 1
    return text[start:text.find(end)]


def splice(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` holding ``body``."""
    old = current_block(text, name)
    start = text.find(markers(name)[0] + "\n") + len(markers(name)[0]) + 1
    return text[:start] + body + text[start + len(old):]
