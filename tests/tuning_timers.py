"""A stand-in for the tuner's timer (gpu/tuner.py's _timer) in tests that check what a tuning pick does."""
from __future__ import annotations


def preferring(shape):
    """A timer that builds and runs every candidate plan once and reports `shape` the fastest (the others
    in their order), so that a pick other than the built-in shape is visible."""
    def timer(dev, plans, reps, min_s, reset, max_repeat, n=1):
        for p in plans.values():
            reset()
            p.run(n)
        return {s: 0.5 if s == shape else 1.0 + i for i, s in enumerate(plans)}
    return timer
