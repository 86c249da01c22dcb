"""Derived, hash-stable seeds.

Every random choice in the workbook draws from a ``random.Random`` seeded by
:func:`derive_seed`, which hashes its parts with SHA-256. Python's built-in
``hash()`` is salted per process (PYTHONHASHSEED), so it is never used for seeds;
the same parts give the same seed on every machine and in every process
(nanochat-style per-sample seeds: ``derive_seed(base, "val", index)``).
"""

from __future__ import annotations

import hashlib
import random


def derive_seed(*parts: object) -> int:
    """Return a 63-bit seed that depends only on ``repr`` of each part, in order.

    ``derive_seed(0, "val", 3) != derive_seed(0, "val", 4)``; parts are joined with a
    separator that cannot occur inside ``repr`` of ints and plain strings' reprs.
    """
    text = "\x1f".join(repr(p) for p in parts)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def rng_for(*parts: object) -> random.Random:
    """A fresh ``random.Random`` seeded with ``derive_seed(*parts)``."""
    return random.Random(derive_seed(*parts))
