"""Byte-level tokenizer: token id = UTF-8 byte. 256 ids, nothing to train or download."""

from __future__ import annotations

VOCAB_SIZE = 256


def encode(text: str) -> list[int]:
    """Text -> token ids (its UTF-8 bytes)."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Token ids -> text; bytes that do not form valid UTF-8 become U+FFFD."""
    bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
    if bad:
        raise ValueError(f"token ids must lie in [0, {VOCAB_SIZE}), got {bad[:5]}")
    return bytes(ids).decode("utf-8", errors="replace")
