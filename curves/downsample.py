"""Bounded plotted traces: at most `max_points` real points per line, extremes kept.

A long console log holds hundreds of thousands of steps per series, and a report that drew
them all would grow with the log. A screen is a few thousand pixels wide, so each trace
keeps, per bucket of consecutive points, the lowest and the highest one (and the first and
last point of the series): every spike and dip survives, and each kept point is a real
(step, value) pair, so the hover shows logged values, never interpolated ones.
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 2000  # per trace; ~1,000 buckets, a min and a max each


def extreme_indices(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Sorted indices of at most `max_points` points of `values` (1-D, no NaN): the first,
    the last, and the minimum and maximum of each bucket of consecutive points."""
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    size = -(-n // buckets)  # ceiling division: every point falls in a bucket
    padded = size * buckets
    low = np.full(padded, np.inf)
    high = np.full(padded, -np.inf)
    low[:n] = values
    high[:n] = values
    offsets = np.arange(buckets) * size
    lows = offsets + low.reshape(buckets, size).argmin(axis=1)
    highs = offsets + high.reshape(buckets, size).argmax(axis=1)
    kept = np.concatenate([[0, n - 1], lows, highs])
    return np.unique(kept[kept < n])
