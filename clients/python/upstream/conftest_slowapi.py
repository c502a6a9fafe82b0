"""redis-tb's adapter for slowapi's test suite (from a checkout of its repository: its PyPI sdist ships no
tests), which has no conftest of its own: `run.py slowapi=<checkout>` puts this file in tests/.

It changes only what the suite builds: every strategy slowapi can be configured with is redis-tb's token-bucket
strategy, so the suite's `memory://` limiters run on its in-memory buckets. The tests themselves run unchanged.
"""

from __future__ import annotations

import limits.strategies

from redis_tb.limits import TokenBucketRateLimiter

for name in ("fixed-window", "moving-window", "sliding-window-counter"):
    limits.strategies.STRATEGIES[name] = TokenBucketRateLimiter
