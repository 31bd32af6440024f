"""What-if: how fast recorded decisions replay in process, what recording adds to a decision,
and how much Redis a record takes.

    .venv/bin/python bench/whatif.py                      # 200,000 records, 5 rounds; its own redis-server
    .venv/bin/python bench/whatif.py --records 50000 --rounds 3

1. Replay: `core.replay.compare` on N records of the HTTP bench's workload (1,000 users in 50
   teams and one global key, a token bucket at each level; one decision every 50 us, so that
   N = 200,000 spans 10 s), under the current policy and under a draft whose team bucket is
   four times smaller (many newly denied). Timed in CPU seconds of this process (a shared
   machine's wall clock swings more), the best round of `--rounds`. Two figures: recorded
   decisions a second (each replayed twice, under both policies, and counted: what an operator
   waits for), and decisions replayed a second (twice as many). The same run also times one
   replay alone, for a peer: `HierarchicalLimiter.acquire` on the same records, back to back.
2. Recording: what `DecisionRecorder.decision` adds on the decision's path (an append), and
   what the flushing thread spends per record (encoding and `XADD ... MAXLEN ~` in a pipeline,
   reply included), against a peer in the same run: `DenialStats.record`, which every decision
   already pays.
3. Redis memory per record: `used_memory` before and after N records in the stream (allowed
   decisions; then denials, which carry their blocked_by), and `MEMORY USAGE` of the stream.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

from bench.redis_store import redis_server  # noqa: E402
from core import Decision, HierarchicalLimiter, ManualClock, MemoryStore  # noqa: E402
from core.recorder import DECISION, DecisionRecorder, Record, RedisLog, encode  # noqa: E402
from core.replay import compare  # noqa: E402
from core.stats import DenialStats  # noqa: E402

START = 1_780_000_000.0
STEP = 50e-6  # seconds between recorded decisions
CONFIG = {
    "user": [{"type": "token_bucket", "capacity": 100, "per_second": 50}],
    "team": [{"type": "token_bucket", "capacity": 2000, "per_second": 1000}],
    "global": [{"type": "token_bucket", "capacity": 1_000_000, "per_second": 100_000}],
}
DRAFT = {**CONFIG, "team": [{"type": "token_bucket", "capacity": 500, "per_second": 250}]}


class OneTier:
    """A policy of one tier for every team key (what core.replay asks of a policy)."""

    def __init__(self, config: dict) -> None:
        self.config = config

    def route(self, team_key, now):
        return ("tier", "all")

    def limiter(self, route, store, clock):
        return HierarchicalLimiter.from_config(self.config, store=store, clock=clock)

    def next_expiry(self, now):
        return math.inf


def records(n: int) -> list[Record]:
    keys = [{"user": f"user-{u}", "team": f"team-{u % 50}", "global": "*"} for u in range(1000)]
    return [Record(START + i * STEP, DECISION, keys[i % 1000]) for i in range(n)]


def cpu_seconds(run) -> float:
    gc.collect()
    start = time.process_time()
    run()
    return time.process_time() - start


def bench_replay(recorded: list[Record], rounds: int) -> None:
    end = recorded[-1].time + STEP
    whole, alone = [], []
    result = None
    for _ in range(rounds):

        def both():
            nonlocal result
            result = compare(recorded, OneTier(CONFIG), OneTier(DRAFT), START, end, 60)

        def acquire_alone():
            clock = ManualClock(START)
            limiter = HierarchicalLimiter.from_config(CONFIG, store=MemoryStore(), clock=clock)
            for record in recorded:
                clock.now = record.time
                limiter.acquire(record.keys, record.cost, record.priority)

        whole.append(cpu_seconds(both))
        alone.append(cpu_seconds(acquire_alone))
    n = len(recorded)
    totals = result.totals
    print(f"replay of {n:,} records ({totals.allowed_now:,} allowed now, {totals.allowed_draft:,} under the draft)")
    print(
        f"  what-if (both replays and the counts): best {n / min(whole):,.0f} recorded decisions/s "
        f"= {2 * n / min(whole):,.0f} decisions replayed/s; median {n / statistics.median(whole):,.0f}; "
        f"{min(whole):.2f} s for all"
    )
    print(f"  peer, acquire alone back to back:      best {n / min(alone):,.0f} decisions/s")
    print(f"  so the what-if's records/s is {min(alone) / min(whole):.2f}x one bare pass over them")


def bench_recording(client: redis.Redis, rounds: int, n: int = 20_000) -> None:
    keys = [{"user": f"user-{u}", "team": f"team-{u % 50}", "global": "*"} for u in range(1000)]
    allowed = Decision(True)
    append, stats_record, flush = [], [], []
    for _ in range(rounds):
        recorder = DecisionRecorder(client=client, limit=200_000, prefix="bench", flush_every=None)
        stats = DenialStats(flush_every=None)

        def appends(recorder=recorder):
            for i in range(n):
                recorder.decision(keys[i % 1000], 1, None, allowed)

        def stats_records(stats=stats):
            for i in range(n):
                stats.record(keys[i % 1000], allowed, 1)

        append.append(cpu_seconds(appends) / n)
        stats_record.append(cpu_seconds(stats_records) / n)
        start = time.perf_counter()
        flush_cpu = cpu_seconds(recorder.flush)
        flush.append((flush_cpu / n, (time.perf_counter() - start) / n))
    us = 1e6
    print(f"recording, per decision (min of {rounds} x {n:,}):")
    print(f"  on the decision's path, DecisionRecorder.decision: {min(append) * us:.2f} us")
    print(f"  peer, DenialStats.record (already on the path):    {min(stats_record) * us:.2f} us")
    best = min(flush)
    print(
        f"  the flushing thread, encode + XADD in a pipeline: {best[0] * us:.2f} us of this process's CPU "
        f"({best[1] * us:.2f} us wall, Redis's work and the round trips included)"
    )


def bench_memory(client: redis.Redis, n: int) -> None:
    keys = [{"user": f"user-{u}", "team": f"team-{u % 50}", "global": "*"} for u in range(1000)]
    for label, blocked in (("allowed decisions", None), ("denials", "team: token_bucket(2000, 1000/s)")):
        client.flushall()
        log = RedisLog(client, "bench:{records}", n)
        before = client.info("memory")["used_memory"]
        batch = []
        for i in range(n):
            batch.append(Record(START + i * STEP, DECISION, keys[i % 1000], 1, None, blocked is None, blocked))
            if len(batch) == 10_000:
                log.write(batch)
                batch = []
        log.write(batch)
        used = client.info("memory")["used_memory"] - before
        usage = client.memory_usage("bench:{records}", samples=0)
        fields = encode(batch[-1] if batch else Record(START, DECISION, keys[0]))
        print(
            f"Redis memory, {n:,} {label} ({len(fields)} fields each): used_memory +{used / n:.1f} bytes a record, "
            f"MEMORY USAGE {usage / n:.1f} bytes a record ({used / 2**20:.1f} MiB in all)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", help="a redis-server of yours (its data is FLUSHALLed!); default: our own")
    options = parser.parse_args()
    bench_replay(records(options.records), options.rounds)
    with redis_server(options.url) as url:
        client = redis.Redis.from_url(url)
        client.flushall()
        bench_recording(client, options.rounds)
        bench_memory(client, options.records)


if __name__ == "__main__":
    main()
