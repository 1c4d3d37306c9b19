"""How often profiler.torch runs a span, and what it reports of the runs.

A span (a layer's forward, its backward, its recompute regions) is run `warmup` times untimed,
then timed. With a fixed `repeat` it is timed that many times. With `repeat` None ("auto", the
default) it is timed until the median is known to about 1%: at least MIN_RUNS runs, then until
the median's standard error, estimated from the interquartile range as for a normal sample
(1.2533 * IQR / 1.349 / sqrt(n)), is at most TARGET of the median; or, past BUDGET_S seconds
of timed runs, once it has MIN_SLOW_RUNS; or at MAX_RUNS. The spread reported is IQR / median
(with fewer than 4 runs, (max - min) / median)."""
import math
import statistics
import time

WARMUP = 2
MIN_RUNS = 10
MIN_SLOW_RUNS = 3
MAX_RUNS = 1000
TARGET = 0.01
BUDGET_S = 2.0


class Stat:
    """A span's runs: median_ms, runs, spread (as the module docstring says)."""

    def __init__(self, times):
        self.times = times
        self.median_ms = statistics.median(times)
        self.runs = len(times)
        width = _iqr(times) if len(times) >= 4 else max(times) - min(times)
        self.spread = width / self.median_ms if self.median_ms > 0 else 0.0

    def as_json(self):
        return {"runs": self.runs, "spread_pct": round(100 * self.spread, 2)}


def _iqr(times):
    q = statistics.quantiles(times, n=4)
    return q[2] - q[0]


def _settled(times):
    n = len(times)
    if n < MIN_RUNS:
        return False
    median = statistics.median(times)
    return 1.2533 * _iqr(times) / 1.349 / math.sqrt(n) <= TARGET * median


def runs(once, repeat, warmup=WARMUP):
    """Calls once() (which returns its own timed milliseconds) warmup times, then as the policy
    above says; the timed results as a list."""
    for _ in range(warmup):
        once()
    times = []
    if repeat is not None:
        return [once() for _ in range(repeat)]
    start = time.perf_counter()
    while len(times) < MAX_RUNS:
        times.append(once())
        slow = time.perf_counter() - start > BUDGET_S and len(times) >= MIN_SLOW_RUNS
        if slow or _settled(times):
            break
    return times


def measure(once, repeat, warmup=WARMUP):
    return Stat(runs(once, repeat, warmup))


def describe(repeat):
    """The policy in words, for the profile's provenance."""
    if repeat is not None:
        return "median of %d timed runs after %d untimed" % (repeat, WARMUP)
    return ("median of timed runs after %d untimed, repeated until its standard error is "
            "under %g%% of it (at least %d runs; past %g s, at least %d; at most %d)"
            % (WARMUP, 100 * TARGET, MIN_RUNS, BUDGET_S, MIN_SLOW_RUNS, MAX_RUNS))
