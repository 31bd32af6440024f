"""The Redis store: rule state in Redis, one atomic Lua call per decision.

Every built-in rule has a Lua twin in `lua/` doing the same arithmetic on the same doubles,
so a decision on Redis is the decision the in-process store would make. One script call
checks every rule of every level and takes from all or none: one round trip per decision,
atomic across every worker and machine that shares the Redis.

The clock is the Redis server's `TIME` unless one is injected, so machines with skewed
clocks agree. Every key has a prefix, a hash tag and a TTL (see `key_name`).

The Lua is a Redis 7 function library, loaded once (`FUNCTION LOAD`) and called with `FCALL`
packed in advance on connections held per pool (connections.py); its name carries a hash of
its source, so deployments of different code share a Redis without calling each other's. A
server that lost it (a restart without persistence, `FUNCTION FLUSH`) answers that the
function is not found, without running anything: the store loads it and calls again. A
Redis older than 7 gets the same Lua as a script (EVALSHA, reloaded after NOSCRIPT), and so
does a client that is not a plain redis-py one (the cluster's).

When Redis cannot be reached, calls fail within the socket timeouts (50 ms by default) and
raise StoreUnavailable; the limiter then applies each level's fail mode. A circuit breaker
stops paying the timeout on every call while Redis is down, and tries again with backoff
(at most every half second, so decisions are back on Redis within a second of its return).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import random
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError, WatchError
from redis.retry import Retry

from ..buckets import GCRA, TokenBucket
from ..concurrency import Concurrency
from ..decision import allowed
from ..errors import ConfigError, ReservationNotFound, ReservationSettled, StoreUnavailable
from ..reservations import CANCELLED, COMMITTED, OPEN
from ..rules import Rule
from ..windows import FixedWindow, SlidingWindowCounter, SlidingWindowLog
from .base import Check, Outcome, Store
from .connections import HeldConnections, bulk, held_connections
from .memory import MemoryStore

LUA_DIR = Path(__file__).parent / "lua"
LUA_FILES = (
    "prelude.lua",
    "token_bucket.lua",
    "fixed_window.lua",
    "sliding_window.lua",
    "sliding_window_counter.lua",
    "concurrency.lua",
    "decide.lua",
)
# The two numbers each built-in rule hands its Lua twin, by class: a plug-in subclass,
# whose behaviour may differ, does not run on Lua.
LUA_ARGS: dict[type, tuple[str, str]] = {
    TokenBucket: ("capacity", "rate"),
    GCRA: ("capacity", "rate"),
    FixedWindow: ("capacity", "window"),
    SlidingWindowCounter: ("capacity", "window"),
    SlidingWindowLog: ("capacity", "window"),
    Concurrency: ("capacity", "lease"),
}
# How each rule's state is read back for explain() and inspect().
READ_COMMANDS = {
    TokenBucket: "GET",
    GCRA: "GET",
    FixedWindow: "GET",
    SlidingWindowCounter: "GET",
    SlidingWindowLog: "LRANGE",
    Concurrency: "ZRANGE",
}
NOSCRIPT_TRIES = 3
# How rule state keys are named (see RedisStore.key_name).
KEY_FORMATS = ("compact", "readable")
DEFAULT_TIMEOUT = 0.05
# How long a batch may wait for its pipeline's answers. A batch of 1,000 decisions is ~30 ms of
# Lua, and several batches queue at the one Redis thread: under the single decision's 50 ms,
# a busy Redis would fail whole batches open. Connecting still gives up after DEFAULT_TIMEOUT.
BATCH_TIMEOUT = 1.0
# One connection per thread deciding at once; redis-py's default of 100 would refuse the
# 101st thread rather than make it wait (and a refusal would count as an outage).
MAX_CONNECTIONS = 10_000
# How long an optimistic decision keeps trying while other clients keep changing its keys.
OPTIMISTIC_DEADLINE = 1.0
NO_SHADOWS: tuple = ()


def lua_body() -> str:
    """The rules' Lua, then `decide`, the function that uses them."""
    return "\n".join((LUA_DIR / name).read_text() for name in LUA_FILES)


def lua_source() -> str:
    """The Lua as one script, for EVALSHA: defines everything, then decides."""
    return lua_body() + "\nreturn decide(KEYS, ARGV)\n"


def lua_library(library: str, function: str) -> str:
    """The Lua as a function library, for FUNCTION LOAD: `function` calls `decide`."""
    return f"#!lua name={library}\n{lua_body()}\nredis.register_function('{function}', decide)\n"


class CircuitBreaker:
    """Open after `threshold` failures in a row: calls then fail at once, without touching
    the network, until the backoff has passed; then calls may try again. The backoff doubles
    up to `most`. A single slow reply (a busy host) does not open it; a dead Redis, which
    fails every call, opens it within a few calls."""

    def __init__(
        self, first: float = 0.05, most: float = 0.5, threshold: int = 3, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.first, self.most, self.threshold, self.clock = first, most, threshold, clock
        self.failures = 0
        self.probing = False
        self.backoff = 0.0
        self.open_until = 0.0
        self.down_since: float | None = None  # monotonic time of the first failure

    def allows(self) -> bool:
        """Closed: yes. Open: no, until the backoff has passed; then yes for one caller at a
        time (the probe), so that a frozen Redis costs one timeout per backoff, not one per
        waiting thread."""
        if not self.open_until:
            return True
        if self.probing or self.clock() < self.open_until:
            return False
        self.probing = True
        return True

    def succeeded(self) -> None:
        if self.failures:
            self.failures, self.backoff, self.open_until, self.down_since = 0, 0.0, 0.0, None
        self.probing = False

    def failed(self) -> None:
        now = self.clock()
        self.failures += 1
        self.probing = False
        if self.down_since is None:
            self.down_since = now
        if self.failures >= self.threshold:
            self.backoff = min(self.most, self.backoff * 2 or self.first)
            self.open_until = now + self.backoff


class RedisPlan:
    """One key set, resolved: key names, the rules as the script reads them (`spec`), and
    whether a plug-in rule with no Lua twin sends it down the optimistic path."""

    __slots__ = ("keys", "key_count", "spec", "checks", "leased", "optimistic")

    def __init__(self, keys: list[str], spec: str, checks: Sequence[Check], optimistic: bool) -> None:
        self.keys, self.spec, self.checks = tuple(keys), spec, list(checks)
        self.key_count = len(keys)
        self.leased = any(check.rule.leased for check in checks)
        self.optimistic = optimistic


class RedisStore(Store):
    """Rule state in Redis. Give it a client (Django passes django-redis's) or a URL."""

    clock = staticmethod(lambda: None)  # None: the script reads the server's TIME

    client: redis.Redis | RedisCluster
    batch_client: redis.Redis | RedisCluster

    def __init__(
        self,
        client: redis.Redis | RedisCluster | None = None,
        url: str | None = None,
        prefix: str = "la",
        timeout: float = DEFAULT_TIMEOUT,
        breaker: CircuitBreaker | None = None,
        batch_client: redis.Redis | RedisCluster | None = None,
        key_format: str = "compact",
    ) -> None:
        if key_format not in KEY_FORMATS:
            raise ConfigError(f"must be one of {', '.join(KEY_FORMATS)}, not {key_format!r}", "key_format")
        self.key_format = key_format
        url = url or "redis://127.0.0.1:6379/0"
        self.client = client if client is not None else connect(url, timeout)
        # Batches read their answers on a client of their own, with a longer read timeout.
        if batch_client is None and client is None:
            batch_client = connect(url, timeout, read_timeout=max(timeout, BATCH_TIMEOUT))
        self.batch_client = batch_client if batch_client is not None else self.client
        self.prefix = prefix
        self.breaker = breaker or CircuitBreaker()
        self.source = lua_source()
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        # The library's name and its function's carry the hash of the Lua they load.
        digest = hashlib.sha1(lua_body().encode()).hexdigest()[:16]
        self.library, self.function = f"limiter_admin_{digest}", f"limiter_admin_decide_{digest}"
        self.library_source = lua_library(self.library, self.function)
        self._fcall_head = bulk(b"FCALL") + bulk(self.function.encode())
        self._evalsha_head = bulk(b"EVALSHA") + bulk(self.sha.encode())
        # FCALL until the server says it has no such command (Redis 6): then EVALSHA.
        self._head = self._fcall_head
        # A plain client's calls go out on held connections; another kind of client (a
        # cluster's) gets EVALSHA through its own methods, as it routes them.
        self._held: HeldConnections | None = None
        if isinstance(self.client, redis.Redis) and hasattr(self.client, "connection_pool"):
            self._held = held_connections(self.client.connection_pool)
        else:
            self._head = self._evalsha_head
        self._lock = threading.Lock()
        self._turns = [threading.Lock() for _ in range(64)]

    def prepare(self, checks: Sequence[Check]) -> RedisPlan:
        keys, spec = [], []
        for level, key, rule, floor in checks:
            keys.append(self.key_name(level, key, rule))
            if type(rule) in LUA_ARGS:
                first, second = LUA_ARGS[type(rule)]
                spec += [
                    rule.type_name,
                    repr(float(floor)),
                    "1" if rule.counts_requests else "0",
                    "1" if rule.shadow else "0",
                    repr(float(getattr(rule, first))),
                    repr(float(getattr(rule, second))),
                ]
        optimistic = any(type(check.rule) not in LUA_ARGS for check in checks)
        return RedisPlan(keys, "".join(" " + part for part in spec), checks, optimistic)

    def key_name(self, level: str, key: str, rule: Rule) -> str:
        """Compact (the default): `prefix{digest}`, 10 characters of a hash of the level, the
        key and the rule in a hash tag: 14 bytes with the default prefix, the longest name
        that Redis 7.0 keeps in its smallest allocation (a token bucket then costs 117 bytes
        a key, TTL included, where 15 bytes or more cost 133: docs/BENCHMARKS.md). 60 bits:
        among 10 million live keys, the odds that any two share a name are about 1 in 23,000.
        Readable: `prefix:{level:key}:rule`, for reading Redis by eye."""
        if self.key_format == "readable":
            return f"{self.prefix}:{{{level}:{key}}}:{rule_tag(rule)}"
        digest = hashlib.blake2b(f"{level}\0{key}\0{rule.rule_id}".encode(), digest_size=8).digest()
        return f"{self.prefix}{{{base64.urlsafe_b64encode(digest)[:10].decode()}}}"

    def decide(self, plan: RedisPlan, cost: float, now: float | None, lease: str | None) -> Outcome:
        if plan.optimistic:
            return self._call(self._decide_optimistically, plan, cost, now, lease)
        argument = f"{'-' if now is None else repr(now)} {cost!r} {lease or '-'} decide{plan.spec}"
        return outcome_of(self._call(self._script, plan.keys, argument))

    def decider(self, plan: RedisPlan) -> Callable[[float, float, str | None], Outcome]:
        """A plan's decision on held connections: its command is packed once, but for the
        argument that changes; an allowed decision with no shadow rule in the way comes
        back as the Decision itself."""
        if self._held is None or plan.optimistic or type(self).decide is not RedisStore.decide:
            return super().decider(plan)
        keys, spec, call = plan.keys, f" decide{plan.spec}".encode(), self._call
        packed: dict[bytes, bytes] = {}
        fcall = self._fcall

        def decide(cost: float, now: float | None, lease: str | None = None) -> Outcome:
            argument = f"{'-' if now is None else repr(now)} {cost!r} {lease or '-'}".encode() + spec
            reply = call(fcall, keys, b"$%d\r\n%s\r\n" % (len(argument), argument), 1, packed)
            if reply.__class__ is not list and lease is None:
                return allowed(float(reply))
            return outcome_of(reply)

        return decide

    def release(self, plan: RedisPlan, now: float | None, lease: str) -> int:
        if not plan.leased:
            return 0
        if plan.optimistic:
            return self._call(self._release_optimistically, plan, now, lease)
        argument = f"{'-' if now is None else repr(now)} 0 {lease} release{plan.spec}"
        return int(self._call(self._script, plan.keys, argument)[0])

    def decide_many(
        self, items: Sequence[tuple[RedisPlan, float, float | None, str | None]]
    ) -> list[Outcome | StoreUnavailable]:
        """Every Lua decision of the batch in one pipeline (one round trip), in order. A plan
        on the optimistic path is decided on its own, in its turn, between pipelines."""
        results: list = [None] * len(items)
        batch: list[tuple[int, tuple, str]] = []
        for i, (plan, cost, now, lease) in enumerate(items):
            if plan.optimistic:
                self._decide_pipelined(batch, results)
                batch = []
                try:
                    results[i] = self.decide(plan, cost, now, lease)
                except StoreUnavailable as error:
                    results[i] = error
            else:
                at = "-" if now is None else repr(now)
                batch.append((i, plan.keys, f"{at} {cost!r} {lease or '-'} decide{plan.spec}"))
        self._decide_pipelined(batch, results)
        return results

    def _decide_pipelined(self, batch: list[tuple[int, tuple, str]], results: list) -> None:
        if not batch:
            return
        try:
            answers = self._call(self._evalsha_many, [(keys, argument) for _, keys, argument in batch])
        except StoreUnavailable as error:
            for i, *_ in batch:
                results[i] = error
            return
        failed = False
        for (i, *_), answer in zip(batch, answers):
            if isinstance(answer, Exception):  # that one did not run; the others counted
                results[i], failed = StoreUnavailable(f"Redis cannot decide: {answer}"), True
            else:
                results[i] = outcome_of(answer)
        if failed:
            with self._lock:
                self.breaker.failed()

    def _evalsha_many(self, calls: list[tuple[tuple, str]], client: redis.Redis | RedisCluster | None = None) -> list:
        """One script call per (keys, argument), pipelined on `client` (the batch client by
        default): one round trip; FCALL, or EVALSHA on a server without functions. The calls
        that did not run (the library or script was missing, or FCALL unknown) are sent
        again, in order, once that is put right; those that ran are never sent twice. Errors
        come back in the list."""
        client = client if client is not None else self.batch_client
        answers: list = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in range(NOSCRIPT_TRIES + 1):
            head = self._head
            command = ("FCALL", self.function) if head is self._fcall_head else ("EVALSHA", self.sha)
            with client.pipeline(transaction=False) as pipe:
                for i in pending:
                    keys, argument = calls[i]
                    pipe.execute_command(*command, len(keys), *keys, argument)
                replies = pipe.execute(raise_on_error=False)
            missing = []
            for i, reply in zip(pending, replies):
                answers[i] = reply
                if isinstance(reply, ResponseError) and self._did_not_run(head, reply):
                    missing.append(i)
            if not missing or attempt == NOSCRIPT_TRIES:
                break
            self._put_right(head, answers[missing[0]], client)
            pending = missing
        return answers

    # --- reservations: a hash per record, with a TTL -------------------------------------

    def reservation_key(self, reservation_id: str) -> str:
        """`prefix:reservation:id`: the record of one reservation."""
        return f"{self.prefix}:reservation:{reservation_id}"

    def time(self) -> float:
        seconds, micros = self._call(self.client.time)
        return seconds + micros / 1_000_000

    def reserve(self, plan: RedisPlan, cost: float, now: float, lease: str | None, record: dict) -> Outcome:
        key, expires_at = self.reservation_key(record["id"]), record["expires_at"]
        if plan.optimistic:
            outcome = self._call(self._decide_optimistically, plan, cost, now, lease, expires_at)
            if outcome[0] < 0:  # a second call: the record, written once the take is done
                untaken = [plan.keys[i] for i in outcome[3]]
                ttl = math.ceil(record["hold"] * 1000) + 1000  # a second of slack, as for state
                self._call(self._write_record, key, record_fields(record, untaken), ttl)
            return outcome
        argument = f"{now!r} {cost!r} {lease or '-'} reserve{plan.spec}"
        fields = [part for pair in record_fields(record, ()).items() for part in pair]
        return outcome_of(self._call(self._script, (*plan.keys, key), argument, repr(expires_at), *fields))

    def _write_record(self, key: str, fields: dict, ttl: int) -> None:
        with self.client_for(key).pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            pipe.pexpire(key, ttl)
            pipe.execute()

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        def read() -> list:
            with self.client_for(self.reservation_key(reservation_id)).pipeline(transaction=False) as pipe:
                pipe.time()
                pipe.hgetall(self.reservation_key(reservation_id))
                return pipe.execute()

        (seconds, micros), raw = self._call(read)
        record = decode_record(raw) if raw else None
        at = seconds + micros / 1_000_000 if now is None else now
        return record if record is not None and at < record["expires_at"] else None

    def settle(
        self, plan: RedisPlan, reservation_id: str, actual_cost: float | None, now: float | None
    ) -> tuple[float, int]:
        key = self.reservation_key(reservation_id)
        if plan.optimistic:
            answer = self._call(self._settle_optimistically, plan, key, actual_cost, now)
        else:
            argument = (
                f"{'-' if now is None else repr(now)} "
                f"{'-' if actual_cost is None else repr(actual_cost)} - settle{plan.spec}"
            )
            answer = self._call(self._script, (*plan.keys, key), argument)
        if answer[0] == b"missing":
            raise ReservationNotFound(f"no reservation {reservation_id!r} (unknown or expired)")
        if answer[0] == b"settled":
            raise ReservationSettled(f"reservation {reservation_id!r} is already {answer[1].decode()}")
        return float(answer[2]), int(answer[1])

    def explain(self, plan: RedisPlan, cost: float, now: float | None) -> list[tuple[float, float]]:
        now, states = self._read(plan, now)
        rows = []
        for check, state in zip(plan.checks, states):
            amount = 1.0 if check.rule.counts_requests else cost
            rows.append((check.rule.wait(state, now, amount, check.floor), check.rule.remaining(state, now)))
        return rows

    def inspect(self, plan: RedisPlan, now: float | None) -> list[dict]:
        now, states = self._read(plan, now)
        return [check.rule.inspect(state, now) for check, state in zip(plan.checks, states)]

    def reset(self, plan: RedisPlan) -> None:
        if plan.keys:
            self._call(self.client.delete, *plan.keys)

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
        self.client.close()
        if self.batch_client is not self.client:
            self.batch_client.close()

    def client_for(self, key: str | None = None) -> redis.Redis | RedisCluster:
        """The client that reaches `key`'s server: transactions, WATCH and reads of several
        keys go there (one server here; the node that holds the key's slot on a cluster)."""
        return self.client

    def ping(self) -> None:
        self._call(self.client.ping)  # within the timeout; at once while the breaker is open

    def _read(self, plan: RedisPlan, now: float | None, pipe: Any = None) -> tuple[float, list]:
        """Every check's state, read in one round trip and decoded into the Python rule's
        own shape, so that explain() and inspect() reuse the rules' Python code. With a
        pipeline that WATCHes, the reads go out one by one (that is how WATCH works)."""
        reader = pipe if pipe is not None else self.client_for(*plan.keys[:1]).pipeline(transaction=True)
        results = [reader.time()]
        for key, check in zip(plan.keys, plan.checks):
            command = READ_COMMANDS.get(type(check.rule), "GET")
            if command == "GET":
                results.append(reader.get(key))
            elif command == "LRANGE":
                results.append(reader.lrange(key, 0, -1))
            else:
                results.append(reader.zrange(key, 0, -1, withscores=True))
        if pipe is None:
            results = self._call(reader.execute)
        (seconds, micros), *raw = results
        now = seconds + micros / 1_000_000 if now is None else now
        return now, [decode(check.rule, value) for check, value in zip(plan.checks, raw)]

    def _decide_optimistically(
        self, plan: RedisPlan, cost: float, now: float | None, lease: str | None, lease_until: float | None = None
    ) -> Outcome:
        """A plan with a plug-in rule that has no Lua twin: WATCH its keys, read every state,
        decide in Python (the in-process store's two phases), then write in MULTI/EXEC; if a
        key changed meanwhile, EXEC fails and the whole decision is made again. Costs 3 + n
        round trips, and retries under contention; a Lua decision costs one. `lease_until`:
        when the lease, a reservation's, must run out."""

        def decide(slots: list, at: float, _: Any) -> tuple[Outcome, list[bool], None]:
            outcome = MemoryStore._decide(slots, cost, at, lease)
            if outcome[0] >= 0:
                return outcome, [False] * len(slots), None
            if lease_until is not None and lease:  # a reservation's: its slots last as long as it does
                MemoryStore._shorten_leases(slots, lease, lease_until)
            shadows = {slots[i][2] for i in outcome[3]}  # shadow rules that would deny take nothing
            return outcome, [name not in shadows for _, _, name, *_ in slots], None

        return self._optimistically(plan, now, decide)

    def _release_optimistically(self, plan: RedisPlan, now: float | None, lease: str) -> int:
        def release(slots: list, at: float, _: Any) -> tuple[int, list[bool], None]:
            changed = []
            for rule, table, name, *_ in slots:
                state = rule.release(table[name], at, lease) if rule.leased else None
                if state is not None:
                    table[name] = state
                changed.append(state is not None)
            return sum(changed), changed, None

        return self._optimistically(plan, now, release)

    def _settle_optimistically(
        self, plan: RedisPlan, record_key: str, actual_cost: float | None, now: float | None
    ) -> list:
        """settle.lua's steps in Python, for a plan with a plug-in rule: the record is
        watched with the rules' keys, and marked settled in the same MULTI/EXEC."""

        def settle(slots: list, at: float, raw: dict) -> tuple[list, list[bool], dict | None]:
            record = decode_record(raw) if raw else None
            if record is None or at >= record["expires_at"]:
                return [b"missing"], [False] * len(slots), None
            if record["status"] != OPEN:
                return [b"settled", record["status"].encode()], [False] * len(slots), None
            delta, lease = (actual_cost or 0) - record["cost"], record["lease"]
            changed, released = [], 0
            for rule, table, name, _, _, per_request in slots:
                touched = False
                if delta and not per_request and f"untaken:{name}".encode() not in raw:
                    table[name], touched = rule.adjust(table[name], at, delta, record["taken_at"]), True
                if lease and rule.leased:
                    state = rule.release(table[name], at, lease)
                    if state is not None:
                        table[name], touched, released = state, True, released + 1
                changed.append(touched)
            status = CANCELLED if actual_cost is None else COMMITTED
            fields = {"status": status, "actual_cost": json.dumps(actual_cost)}
            return [b"ok", released, repr(float(delta))], changed, fields

        return self._optimistically(plan, now, settle, record_key)

    def _optimistically(self, plan: RedisPlan, now: float | None, work: Callable, record_key: str | None = None) -> Any:
        # Threads of this process take turns per key set, so that WATCH only ever races
        # other processes: 200 threads all watching one key would mostly fail each other.
        with self._turns[hash(plan.keys) % len(self._turns)]:
            return self._watch_and_write(plan, now, work, record_key)

    def _watch_and_write(
        self, plan: RedisPlan, now: float | None, work: Callable, record_key: str | None = None
    ) -> Any:
        """WATCH the plan's keys (and a reservation's record, read first and handed to
        `work`), read every state, let `work` change them, and write back in MULTI/EXEC
        the states it changed (and the record's fields it returns)."""
        deadline = time.monotonic() + OPTIMISTIC_DEADLINE
        with self.client_for(*plan.keys[:1]).pipeline(transaction=True) as pipe:
            for attempt in itertools.count():
                if attempt and time.monotonic() > deadline:
                    break
                if attempt:  # back off, with jitter, so that contenders stop colliding
                    time.sleep(random.uniform(0, min(0.01, 0.0002 * 2**attempt)))
                try:
                    pipe.watch(*plan.keys, *([record_key] if record_key else []))
                    record = pipe.hgetall(record_key) if record_key else None
                    at, states = self._read(plan, now, pipe)
                    table = dict(zip(plan.keys, states))
                    slots = [
                        (c.rule, table, key, c.floor, c.rule.shadow, c.rule.counts_requests)
                        for c, key in zip(plan.checks, plan.keys)
                    ]
                    result, changed, fields = work(slots, at, record)
                    pipe.multi()
                    # Some rules change their state in place, so every state of a check
                    # that took (or released) is written back; a denial writes nothing.
                    for (check, key), took in zip(zip(plan.checks, plan.keys), changed):
                        if took and table[key] is not None:
                            write(pipe, key, check.rule, table[key], at)
                        elif took:
                            pipe.delete(key)  # as good as no state: a bucket refunded to full
                    if fields and record_key:
                        pipe.hset(record_key, mapping=fields)
                    pipe.execute()
                    return result
                except WatchError:
                    continue
        raise StoreUnavailable(f"Redis keys kept changing for {OPTIMISTIC_DEADLINE} s")

    def _script(self, keys: Sequence[str], *args: str) -> Any:
        """One call of the Lua on `keys` with `args`: FCALL on a held connection, or, for
        a client that is not a plain one, EVALSHA through its own method."""
        if self._held is None:
            return self._evalsha(*keys, *args, keys=len(keys))
        return self._fcall(keys, b"".join(bulk(arg.encode()) for arg in args), len(args), {})

    def _fcall(self, keys: Sequence[str], tail: bytes, count: int, packed: dict) -> Any:
        """Send the command: the head (FCALL and the function, or EVALSHA and the sha),
        `keys`, then `tail`, the `count` arguments packed. `packed` keeps the command up to
        `tail` by head, for the next call with the same keys. A call that ran nothing
        because the library (or script) was missing, or FCALL is unknown, is put right and
        sent again: it cannot count a decision twice."""
        held = self._held
        assert held is not None, "only a plain client's calls go out on held connections"
        for attempt in range(NOSCRIPT_TRIES + 1):
            head = self._head
            start = packed.get(head)
            if start is None:
                start = packed[head] = (
                    b"*%d\r\n" % (3 + len(keys) + count)
                    + head
                    + bulk(b"%d" % len(keys))
                    + b"".join(bulk(key.encode()) for key in keys)
                )
            try:
                return held.call(start + tail)
            except ResponseError as error:
                if attempt == NOSCRIPT_TRIES or not self._did_not_run(head, error):
                    raise
                self._put_right(head, error, self.client)

    def _did_not_run(self, head: bytes, error: ResponseError) -> bool:
        """Whether `error`, the answer to a call with `head`, says that nothing ran because
        what it calls is missing from the server."""
        if head is self._fcall_head:
            return str(error).startswith(("Function not found", "unknown command"))
        return isinstance(error, NoScriptError)

    def _put_right(self, head: bytes, error: ResponseError, client: redis.Redis | RedisCluster) -> None:
        """Load what was missing; on a server without functions, go over to EVALSHA."""
        if head is not self._fcall_head:
            self.sha = client.script_load(self.source)
        elif str(error).startswith("unknown command"):
            client.script_load(self.source)
            self._head = self._evalsha_head
        else:
            # REPLACE: two processes loading the same library at once must both succeed;
            # the name holds the source's hash, so what it replaces is the same code.
            client.execute_command("FUNCTION", "LOAD", "REPLACE", self.library_source)

    def _evalsha(self, *keys_and_args: str, keys: int) -> Any:
        """One EVALSHA; a server that lost its script cache (restart, SCRIPT FLUSH) answers
        NOSCRIPT without running anything, so loading the script and calling again cannot
        count a decision twice."""
        for _ in range(NOSCRIPT_TRIES):
            try:
                return self.client.evalsha(self.sha, keys, *keys_and_args)
            except NoScriptError:  # flushed again between our load and our call: load again
                self.sha = self.client.script_load(self.source)
        return self.client.evalsha(self.sha, keys, *keys_and_args)

    def _call(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        if self.breaker.open_until:
            with self._lock:
                allowed = self.breaker.allows()
            if not allowed:
                raise StoreUnavailable("Redis is unreachable; waiting before trying again")
        try:
            result = function(*args, **kwargs)
        except RedisError as error:
            # Any driver error, not only a lost connection (out of memory, a read-only
            # replica, a server still loading), means this store cannot decide right now:
            # the limiter's fail modes handle it, and the breaker stops us insisting.
            with self._lock:
                self.breaker.failed()
            raise StoreUnavailable(f"Redis cannot decide: {error}") from error
        except BaseException:
            with self._lock:
                self.breaker.probing = False  # whatever happened, the next probe may go
            raise
        if self.breaker.failures or self.breaker.probing:
            with self._lock:
                self.breaker.succeeded()
        return result


def outcome_of(reply: Any) -> Outcome:
    """A decision's reply as an Outcome: the script sends the room left alone when every
    rule took and no shadow rule would have denied, else all four fields."""
    if reply.__class__ is not list:
        return -1, 0.0, float(reply), NO_SHADOWS
    blocker, wait, remaining, shadows = reply
    return blocker, float(wait), float(remaining), tuple(shadows)


def connect(url: str, timeout: float = DEFAULT_TIMEOUT, read_timeout: float | None = None) -> redis.Redis:
    """A plain redis-py client (with hiredis when installed) that gives up fast: short
    timeouts, no retries. Under Django the client comes from django-redis instead."""
    return redis.Redis.from_url(
        url,
        socket_timeout=read_timeout or timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
        max_connections=MAX_CONNECTIONS,
    )


def write(pipe: Any, key: str, rule: Rule, state: Any, now: float) -> None:
    """Queue the writes that store `state` in Redis, in the form its Lua twin (or, for a
    plug-in, `decode`) reads, with a TTL until it goes idle plus a second."""
    kind = type(rule)
    ttl = max(1000, math.ceil((state[0] - now) * 1000) + 1000)
    if isinstance(rule, TokenBucket) and kind in (TokenBucket, GCRA):
        value = round(state[0] * 1e6) if rule.rate else repr(float(state[2]))
        pipe.set(key, value, px=ttl)
    elif kind is FixedWindow:
        pipe.set(key, f"{state[2]!r} {state[3]!r}", px=ttl)
    elif kind is SlidingWindowCounter:
        pipe.set(key, f"{state[2]!r} {state[3]!r} {state[4]!r}", px=ttl)
    elif kind is SlidingWindowLog:
        pipe.delete(key)
        if state[2]:
            pipe.rpush(key, *(f"{stamp!r} {spent!r}" for stamp, spent in state[2]))
            pipe.pexpire(key, ttl)
    elif kind is Concurrency:
        pipe.delete(key)
        if state[2]:
            pipe.zadd(key, state[2])
            pipe.pexpire(key, ttl)
    else:  # a plug-in: its state tuple as JSON, so its fields must be JSON values
        pipe.set(key, json.dumps(list(state)), px=ttl)


def decode(rule: Rule, raw: Any) -> Any:
    """A rule's state as read from Redis, in the shape its Python code expects."""
    kind = type(rule)
    if raw is None or raw == [] or raw == b"":
        return None
    if kind not in READ_COMMANDS:
        return tuple(json.loads(raw))
    if isinstance(rule, TokenBucket) and kind in (TokenBucket, GCRA):
        value = float(raw)
        return (value * 1e-6, 0.0) if rule.rate else (0.0, 0.0, value)
    if kind is FixedWindow:
        index, used = raw.split()
        return (0.0, 0.0, float(index), float(used))
    if kind is SlidingWindowCounter:
        index, previous, current = raw.split()
        return (0.0, 0.0, float(index), float(previous), float(current))
    if kind is SlidingWindowLog:
        return [0.0, 0.0, deque(tuple(map(float, entry.split())) for entry in raw)]
    return [0.0, 0.0, {lease.decode(): expiry for lease, expiry in raw}]


# The record's fields that hold JSON; `lease` and `status` are plain text, as Lua reads them.
_RECORD_JSON = ("id", "keys", "cost", "priority", "taken_at", "expires_at", "hold", "actual_cost")


def record_fields(record: dict, untaken: Sequence[str]) -> dict:
    """A reservation's record as the fields of its hash: JSON values, the lease as text
    ('' for none), status open, and an `untaken:<state key>` field per shadow rule that
    would have denied (it took nothing, so settling must not give anything back to it)."""
    fields = {name: json.dumps(value) for name, value in record.items() if name in _RECORD_JSON}
    fields.update({"lease": record["lease"] or "", "status": OPEN})
    fields.update({f"untaken:{key}": "1" for key in untaken})
    return fields


def decode_record(raw: dict) -> dict:
    """A record's hash, as read back, in the shape `reservation()` returns."""
    fields = {name.decode(): value.decode() for name, value in raw.items() if not name.startswith(b"untaken:")}
    record = {name: json.loads(fields[name]) for name in _RECORD_JSON if name in fields}
    record.update({"lease": fields.get("lease") or None, "status": fields.get("status", OPEN)})
    return record


def rule_tag(rule: Rule) -> str:
    """A few characters that tell a key's rule from the other rules of its level and key."""
    return _base36(zlib.crc32(rule.rule_id.encode()))


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, digit = divmod(number, 36)
        out = digits[digit] + out
        if not number:
            return out


__all__ = [
    "CircuitBreaker",
    "RedisStore",
    "connect",
    "decode",
    "decode_record",
    "lua_body",
    "lua_library",
    "lua_source",
    "outcome_of",
    "record_fields",
    "write",
]
