"""Small statistics over raw per-request samples: percentiles, distributions, bootstrap CIs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

CI_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def clean(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def distribution(values: Iterable[Any]) -> dict[str, Any] | None:
    """n, mean, p50, p90, p99, min, max and stdev of the numeric values; None if there are none."""
    data = sorted(clean(values))
    if not data:
        return None
    n = len(data)
    mean = sum(data) / n
    stdev = math.sqrt(sum((x - mean) ** 2 for x in data) / (n - 1)) if n > 1 else 0.0
    return {
        "n": n,
        "mean": mean,
        "p50": percentile(data, 50),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
        "min": data[0],
        "max": data[-1],
        "stdev": stdev,
    }


def bootstrap_ci(
    samples: Sequence[Sequence[float]],
    q: float,
    combine: Callable[[list[Any]], Any],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = CI_LEVEL,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile-bootstrap CI of ``combine([quantile_q(S1*), quantile_q(S2*), ...])``.

    Each sample is resampled independently (they come from independent runs or request groups).
    ``combine`` receives numpy arrays (one value per resample) and must be vectorised, e.g.
    ``lambda s: s[1] - s[0]``. Uses numpy, which is installed with matplotlib. Deterministic for
    a seed; None when any sample is empty.
    """
    import numpy as np

    if not samples or any(len(x) == 0 for x in samples):
        return None
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(x, dtype=float) for x in samples]
    batch = max(1, min(resamples, 4_000_000 // max(len(x) for x in arrays)))
    values = []
    done = 0
    while done < resamples:
        count = min(batch, resamples - done)
        stats = [
            np.quantile(arr[rng.integers(0, len(arr), size=(count, len(arr)))], q / 100.0, axis=1)
            for arr in arrays
        ]
        values.append(np.asarray(combine(stats), dtype=float))
        done += count
    merged = np.concatenate(values)
    merged = merged[np.isfinite(merged)]
    if merged.size == 0:
        return None
    low, high = np.quantile(merged, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high)
