"""Timing helpers the benchmark scripts share (imported from bench/ as the scripts' directory)."""

from __future__ import annotations

import time


def per_call(f, budget: float = 0.25) -> float:
    """Seconds per call of f: one warm-up call, then calls until `budget` seconds or 200 calls."""
    f()
    n, t0 = 0, time.perf_counter()
    while True:
        f()
        n += 1
        t = time.perf_counter() - t0
        if t > budget or n >= 200:
            return t / n
