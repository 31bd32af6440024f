"""Decision statistics: who is throttled, by which rule, per tenant and over time.

    stats = DenialStats(client=redis_client)        # shared by every worker; DenialStats() for one process
    stats.record(keys, limiter.acquire(keys), cost)  # in process: no I/O, no round trip added to a decision
    stats.report(window=300)                        # denials by blocked_by, top tenants and keys, a series
    stats.usage("acme", window=86400, step=60)      # one tenant's traffic over time

`record()` adds to a buffer in this process; the process's flushing thread (core/flusher.py)
pushes it every `flush_every` seconds in one MULTI/EXEC, so the counts of every worker that
shares the Redis add up. Without a client the same commands go to a store in this process
(memory.py). Every decision names its tenant (the key at `tenant_level`) and its user (the key
at `user_level`), whichever level blocked it. Buckets are minutes of this process's `clock` (wall time), so
workers with skewed clocks put a decision in a neighbouring minute.

    counts.py        the counts a worker buffers, and the tally of one decision into them
    layout.py        the keys in the store, and how their fields are written and read back
    flush.py         what a flush writes, in one MULTI/EXEC; the sweep of expired reservations
    reports.py       reading back: a window's report, a tenant's usage, the users seen
    checks.py        the options' and the arguments' checks
    denial_stats.py  DenialStats, which records, flushes and reads through the above
    memory.py        the in-process store that runs the same commands
"""

from .checks import STEPS
from .counts import BUFFER_SLACK, LEVEL_CACHE_SIZE, MAX_TENANTS, MinuteCounts, TenantCounts
from .denial_stats import KEPT_MINUTES, SWEEP_EVERY, DenialStats
from .flush import EXPIRY_GRACE, SWEEP_BATCH
from .layout import (
    BY,
    DAY,
    DECISIONS,
    DENIED,
    EMBEDDED,
    EMBEDDED_DENIED,
    HOUR,
    MINUTE,
    OVER_QUOTA,
    OVER_QUOTA_BY,
    QUARTER,
    SEEN_USERS,
    SERIES_FIELDS,
    SHADOW,
    SHADOW_BY,
    TTL_SLACK,
)
from .memory import MemoryStatsStore

__all__ = [
    "BUFFER_SLACK",
    "BY",
    "DAY",
    "DECISIONS",
    "DENIED",
    "EMBEDDED",
    "EMBEDDED_DENIED",
    "EXPIRY_GRACE",
    "HOUR",
    "KEPT_MINUTES",
    "LEVEL_CACHE_SIZE",
    "MAX_TENANTS",
    "MINUTE",
    "OVER_QUOTA",
    "OVER_QUOTA_BY",
    "QUARTER",
    "SEEN_USERS",
    "SERIES_FIELDS",
    "SHADOW",
    "SHADOW_BY",
    "STEPS",
    "SWEEP_BATCH",
    "SWEEP_EVERY",
    "TTL_SLACK",
    "DenialStats",
    "MemoryStatsStore",
    "MinuteCounts",
    "TenantCounts",
]
