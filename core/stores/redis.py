"""The Redis store: rule state in Redis, one atomic Lua call per decision.

Every built-in rule has a Lua twin (core/twins.py) doing the same arithmetic on the same
doubles, so a decision on Redis is the decision the in-process store would make. One script
call checks every rule of every level and takes from all or none: one round trip per decision,
atomic across every worker and machine that shares the Redis.

The clock is the Redis server's `TIME` unless one is injected, so machines with skewed
clocks agree. Every key has a prefix, a hash tag and a TTL (see `key_name`).

The Lua is a Redis 7 function library (stores/library.py), loaded once (`FUNCTION LOAD`) and
called with `FCALL` packed in advance on connections held per pool (connections.py); a plan
names the library that holds its rules' twins. A server that lost it (a restart without
persistence, `FUNCTION FLUSH`) answers that the function is not found, without running
anything: the store loads it and calls again. A Redis older than 7 gets the same Lua as a
script (EVALSHA, reloaded after NOSCRIPT).

A plan with a plug-in rule that has no twin is decided optimistically (optimistic.py): WATCH,
the two phases in Python (core/twophase.py), MULTI/EXEC.

Coroutines decide on redis-py's asyncio client (`adecider`): the same plan, the same packed
argument and the same FCALL of the same library, answered by the same `decision_of`, through
the same circuit breaker; only the wait is awaited. redis-py's asyncio connections belong to
the event loop that made them, so each loop gets a client of its own (a server that runs
every request's coroutine on a loop of its own, an async view under WSGI, pays a connection
per request). The optimistic path and a redirect are awaited in a thread.

When Redis cannot be reached, calls fail within the socket timeouts (50 ms by default) and
raise StoreUnavailable; the limiter then applies each level's fail mode. A circuit breaker
(breaker.py) stops paying the timeout on every call while Redis is down, and tries again with
backoff (at most every half second, so decisions are back on Redis within a second of its
return). A store on a cluster node (cluster.py makes one per primary) hands the calls that the
node redirects (MOVED, ASK) to its `redirect`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import AskError, NoScriptError, RedisError, ResponseError
from redis.retry import Retry

from .. import twophase
from ..decision import Decision, Finding, allowed, found
from ..errors import ConfigError, ReservationNotFound, ReservationSettled, StoreUnavailable
from ..rules import Rule
from ..twins import RedisTwin
from .base import AsyncDecider, Check, Health, Store
from .breaker import CircuitBreaker
from .connections import ASKING, bulk, held_connections, script_call_start
from .keeping import decode_record, record_fields, rule_tag
from .library import LuaLibrary, current_library, lua_body, lua_source
from .optimistic import OptimisticPath, read_slots, record_ttl

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
# How many redirects in a row a call follows before it gives up (a slot moving as we call).
MOST_REDIRECTS = 5

# A cluster's way with a redirected call: (the MOVED or ASK reply, the call's library, keys,
# packed arguments and their number, redirects so far) -> the reply of the node it names.
Redirect = Callable[[AskError, LuaLibrary, Sequence[str], bytes, int, int], Any]


class RedisPlan:
    """One key set, resolved: key names, the library that holds its rules' twins and the
    rules as its script reads them (`spec`), where its reservation records go, and whether
    a plug-in rule with no twin sends it down the optimistic path.

    A twin may hand its Lua numbers of the call's time (a quota's period: core/twins.py,
    `per_call`): such a plan keeps its spec check by check (`parts`) and where those numbers
    go (`timed`), and `spec_at` writes them in per call. Other plans' specs never change."""

    __slots__ = ("keys", "spec", "checks", "leased", "optimistic", "lua", "records", "parts", "timed", "_written")

    def __init__(
        self,
        keys: Sequence[str],
        spec: str,
        checks: Sequence[Check],
        lua: LuaLibrary,
        records: str,
        optimistic: bool,
        parts: Sequence[str] = (),
        timed: Sequence[tuple[int, RedisTwin, Rule]] = (),
    ) -> None:
        self.keys, self.spec, self.checks, self.lua, self.records = tuple(keys), spec, list(checks), lua, records
        self.leased = any(check.rule.leased for check in checks)
        self.optimistic = optimistic
        self.parts, self.timed = tuple(parts), tuple(timed)
        # The last per-call numbers, their spec, and the spec as a decision's argument ends.
        self._written: tuple[tuple, str, bytes] = ((), spec, f" decide{spec}".encode())

    def spec_at(self, now: float | None) -> str:
        """The spec of a call at `now` (None: the server's TIME)."""
        return self._write(now)[1] if self.timed else self.spec

    def decide_tail_at(self, now: float | None) -> bytes:
        """`" decide" + spec_at(now)`, encoded: how a decision's argument ends."""
        return self._write(now)[2]

    def _write(self, now: float | None) -> tuple[tuple, str, bytes]:
        # Written again only when the numbers of the call's time change (a quota's period).
        numbers = tuple(twin.per_call(rule, now) for _, twin, rule in self.timed if twin.per_call)
        written = self._written
        if written[0] == numbers:
            return written
        parts = list(self.parts)
        for (i, _, _), values in zip(self.timed, numbers):
            parts[i] += RedisTwin.format_per_call(values)
        spec = "".join(parts)
        written = self._written = (numbers, spec, f" decide{spec}".encode())
        return written


def redis_plan(checks: Sequence[Check], keys: Sequence[str], records: str) -> RedisPlan:
    """The plan of `checks` whose states live under `keys` (and its reservations' records
    under `records` + id): one call of the Lua when every rule has a twin in the library of
    the rules registered now, else the optimistic path."""
    lua = current_library()
    twins = [check.rule.redis_twin for check in checks]
    if any(twin is None or twin.name not in lua.twins for twin in twins):
        return RedisPlan(keys, "", checks, lua, records, optimistic=True)
    parts = [
        f" {twin.name} {float(floor)!r} {'1' if rule.counts_requests else '0'} {enforcement(rule)}"
        f" {twin.arguments(rule)}"
        for (_, _, rule, floor), twin in zip(checks, twins)
        if twin is not None
    ]
    timed = [(i, twin, check.rule) for i, (check, twin) in enumerate(zip(checks, twins)) if twin and twin.per_call]
    return RedisPlan(keys, "".join(parts), checks, lua, records, optimistic=False, parts=parts, timed=timed)


def enforcement(rule: Rule) -> str:
    """How the script enforces a rule: '0' it may deny, '1' a shadow, '2' soft (decide.lua)."""
    return "2" if rule.soft else "1" if rule.shadow else "0"


class RedisStore(Store[RedisPlan]):
    """Rule state in one Redis. Give it a client (Django passes django-redis's) or a URL."""

    clock = staticmethod(lambda: None)  # None: the script reads the server's TIME

    def __init__(
        self,
        client: redis.Redis | None = None,
        url: str | None = None,
        prefix: str = "la",
        timeout: float = DEFAULT_TIMEOUT,
        breaker: CircuitBreaker | None = None,
        batch_client: redis.Redis | None = None,
        key_format: str = "compact",
        name: str = "Redis",
        batch_timeout: float = BATCH_TIMEOUT,
        redirect: Redirect | None = None,
    ) -> None:
        if key_format not in KEY_FORMATS:
            raise ConfigError(f"must be one of {', '.join(KEY_FORMATS)}, not {key_format!r}", "key_format")
        self.key_format, self.prefix, self.name, self.redirect = key_format, prefix, name, redirect
        # Where coroutines connect (their asyncio clients): the URL, else the given client's.
        self.url, self.timeout = url, timeout
        self._async_clients: dict[asyncio.AbstractEventLoop, redis.asyncio.Redis] = {}
        self._async_lock = threading.Lock()
        url = url or "redis://127.0.0.1:6379/0"
        self.client = client if client is not None else connect(url, timeout)
        # Batches read their answers on a client of their own, with a longer read timeout.
        if batch_client is None and client is None:
            batch_client = connect(url, timeout, read_timeout=max(timeout, batch_timeout))
        self.batch_client = batch_client if batch_client is not None else self.client
        self.breaker = breaker or CircuitBreaker()
        self._held = held_connections(self.client.connection_pool)
        # FCALL until the server says it has no such command (Redis 6): then EVALSHA.
        self._scripts_only = False
        self._records = f"{prefix}:reservation:"
        self._scripts: dict[str, Script] = {}
        # Plans with a plug-in rule that has no twin (optimistic.py).
        self.optimistic = OptimisticPath(self.client)

    @property
    def library(self) -> str:
        """The name of the function library this store's new plans call."""
        return current_library().name

    @property
    def library_source(self) -> str:
        return current_library().source

    def prepare(self, checks: Sequence[Check]) -> RedisPlan:
        return redis_plan(checks, [self.key_name(level, key, rule) for level, key, rule, _ in checks], self._records)

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

    # --- decisions --------------------------------------------------------------------------

    def decide(self, plan: RedisPlan, cost: float, now: float | None, lease: str | None) -> Decision | Finding:
        if plan.optimistic:
            return self._call(self.optimistic.decide, plan, cost, now, lease)
        argument = f"{'-' if now is None else repr(now)} {cost!r} {lease or '-'} decide{plan.spec_at(now)}"
        return outcome_of(self._call(self._script, plan.lua, plan.keys, argument))

    def decider(self, plan: RedisPlan) -> Callable[[float, float, str | None], Decision | Finding]:
        """A plan's decision on held connections: its command is packed once, but for the
        argument that changes; an allowed decision with no shadow rule in the way comes
        back as the Decision itself. A plan whose spec changes with the time (a quota's) writes
        its spec per call, in a decider of its own, so that the others pay nothing for it."""
        if plan.optimistic:
            return super().decider(plan)
        lua, keys, spec, call, fcall = plan.lua, plan.keys, f" decide{plan.spec}".encode(), self._call, self._fcall
        packed: dict[bool, bytes] = {}
        tail_at = plan.decide_tail_at

        def decide(cost: float, now: float | None, lease: str | None = None) -> Decision | Finding:
            argument = f"{'-' if now is None else repr(now)} {cost!r} {lease or '-'}".encode() + spec
            return decision_of(call(fcall, lua, keys, bulk(argument), 1, packed), lease)

        def decide_timed(cost: float, now: float | None, lease: str | None = None) -> Decision | Finding:
            argument = f"{'-' if now is None else repr(now)} {cost!r} {lease or '-'}".encode() + tail_at(now)
            return decision_of(call(fcall, lua, keys, bulk(argument), 1, packed), lease)

        return decide_timed if plan.timed else decide

    def adecider(self, plan: RedisPlan) -> AsyncDecider:
        """`decider` for coroutines: the same argument and FCALL, sent on this event loop's
        asyncio client and awaited. The optimistic path is awaited in a thread."""
        if plan.optimistic:
            return super().adecider(plan)
        lua, keys, tail_at, acall, afcall = plan.lua, plan.keys, plan.decide_tail_at, self._acall, self._afcall

        async def adecide(cost: float, now: float | None, lease: str | None = None) -> Decision | Finding:
            argument = f"{'-' if now is None else repr(now)} {cost!r} {lease or '-'}".encode() + tail_at(now)
            return decision_of(await acall(afcall, lua, keys, argument), lease)

        return adecide

    def release(self, plan: RedisPlan, now: float | None, lease: str) -> int:
        if not plan.leased:
            return 0
        if plan.optimistic:
            return self._call(self.optimistic.release, plan, now, lease)
        argument = f"{'-' if now is None else repr(now)} 0 {lease} release{plan.spec_at(now)}"
        return int(self._call(self._script, plan.lua, plan.keys, argument)[0])

    def decide_many(
        self, items: Sequence[tuple[RedisPlan, float, float | None, str | None]]
    ) -> list[Decision | Finding | StoreUnavailable]:
        """Every Lua decision of the batch in one pipeline (one round trip), in order. A plan
        on the optimistic path is decided on its own, in its turn, between pipelines."""
        results: list = [None] * len(items)
        batch: list[tuple[int, LuaLibrary, tuple, str]] = []
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
                batch.append((i, plan.lua, plan.keys, f"{at} {cost!r} {lease or '-'} decide{plan.spec_at(now)}"))
        self._decide_pipelined(batch, results)
        return results

    def _decide_pipelined(self, batch: list[tuple[int, LuaLibrary, tuple, str]], results: list) -> None:
        if not batch:
            return
        try:
            answers = self._call(self._script_many, [call for _, *call in batch])
        except StoreUnavailable as error:
            for i, *_ in batch:
                results[i] = error
            return
        failed = False
        for (i, *_), answer in zip(batch, answers):
            if isinstance(answer, StoreUnavailable):  # redirected, and the node it named could not
                results[i] = answer
            elif isinstance(answer, Exception):  # that one did not run; the others counted
                results[i], failed = StoreUnavailable(f"Redis cannot decide: {answer}"), True
            else:
                results[i] = outcome_of(answer)
        if failed:
            self.breaker.failed()

    def _script_many(self, calls: list[tuple[LuaLibrary, tuple, str]]) -> list:
        """One script call per (library, keys, argument), pipelined on the batch client: one
        round trip; FCALL, or EVALSHA on a server without functions. The calls that did not
        run (the library or script was missing, or FCALL unknown) are sent again, in order,
        once that is put right; those that ran are never sent twice; those a cluster node
        redirected go where it says. Errors come back in the list."""
        answers: list = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in range(NOSCRIPT_TRIES + 1):
            scripts_only = self._scripts_only
            with self.batch_client.pipeline(transaction=False) as pipe:
                for i in pending:
                    lua, keys, argument = calls[i]
                    name, script = ("EVALSHA", lua.sha) if scripts_only else ("FCALL", lua.function)
                    pipe.execute_command(name, script, len(keys), *keys, argument)
                replies = pipe.execute(raise_on_error=False)
            missing = []
            for i, reply in zip(pending, replies):
                if isinstance(reply, AskError):  # MovedError too: a cluster node's slot is elsewhere
                    reply = self._follow(reply, *calls[i])
                answers[i] = reply
                if isinstance(reply, ResponseError) and self._did_not_run(scripts_only, reply):
                    missing.append(i)
            if not missing or attempt == NOSCRIPT_TRIES:
                break
            self._put_right(calls[missing[0]][0], scripts_only, answers[missing[0]])
            pending = missing
        return answers

    def _follow(self, error: AskError, lua: LuaLibrary, keys: Sequence[str], argument: str) -> Any:
        """A batch's redirected call, sent alone where the node said; its failure as a reply."""
        try:
            return self._redirected(error, lua, keys, bulk(argument.encode()), 1, 0)
        except StoreUnavailable as failure:
            return failure

    # --- reservations: a hash per record, with a TTL -------------------------------------

    def reservation_key(self, reservation_id: str) -> str:
        """`prefix:reservation:id`: the record of one reservation."""
        return self._records + reservation_id

    def time(self) -> float:
        seconds, micros = self._call(self.client.time)
        return seconds + micros / 1_000_000

    def reserve(self, plan: RedisPlan, cost: float, now: float, lease: str | None, record: dict) -> Decision | Finding:
        key, expires_at = plan.records + record["id"], record["expires_at"]
        if plan.optimistic:
            outcome = self._call(self.optimistic.decide, plan, cost, now, lease, expires_at)
            if outcome[0] < 0:  # a second call: the record, written once the take is done
                untaken = [plan.keys[i] for i in outcome[3]]
                written = record_fields(record, untaken)
                self._call(self.optimistic.write_record, key, written, record_ttl(record["hold"]))
            return outcome
        argument = f"{now!r} {cost!r} {lease or '-'} reserve{plan.spec_at(now)}"
        fields = [part for pair in record_fields(record, ()).items() for part in pair]
        return outcome_of(self._call(self._script, plan.lua, (*plan.keys, key), argument, repr(expires_at), *fields))

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        return self.record(self.reservation_key(reservation_id), now)

    def record(self, key: str, now: float | None = None) -> dict | None:
        """The reservation record kept at `key`; None when there is none, or it expired."""

        def read() -> list:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.time()
                pipe.hgetall(key)
                return pipe.execute()

        (seconds, micros), raw = self._call(read)
        record = decode_record(raw) if raw else None
        at = seconds + micros / 1_000_000 if now is None else now
        return record if record is not None and at < record["expires_at"] else None

    def settle(
        self, plan: RedisPlan, reservation_id: str, actual_cost: float | None, now: float | None
    ) -> tuple[float, int]:
        key = plan.records + reservation_id
        if plan.optimistic:
            answer = self._call(self.optimistic.settle, plan, key, actual_cost, now)
        else:
            argument = (
                f"{'-' if now is None else repr(now)} "
                f"{'-' if actual_cost is None else repr(actual_cost)} - settle{plan.spec_at(now)}"
            )
            answer = self._call(self._script, plan.lua, (*plan.keys, key), argument)
        if answer[0] == b"missing":
            raise ReservationNotFound(f"no reservation {reservation_id!r} (unknown or expired)")
        if answer[0] == b"settled":
            raise ReservationSettled(f"reservation {reservation_id!r} is already {answer[1].decode()}")
        return float(answer[2]), int(answer[1])

    # --- reads, and the rest ----------------------------------------------------------------

    def explain(self, plan: RedisPlan, cost: float, now: float | None) -> list[tuple[float, float]]:
        at, _, slots = self._call(read_slots, self.client, plan, now)
        return twophase.explain(slots, cost, at)

    def inspect(self, plan: RedisPlan, now: float | None) -> list[dict]:
        at, _, slots = self._call(read_slots, self.client, plan, now)
        return twophase.inspect(slots, at)

    def reset(self, plan: RedisPlan) -> None:
        if plan.keys:
            self._call(self.client.delete, *plan.keys)

    def adjust(self, plan: RedisPlan, now: float | None, delta: float) -> list[float]:
        if plan.optimistic:
            return self._call(self.optimistic.adjust, plan, now, delta)
        argument = f"{'-' if now is None else repr(now)} {float(delta)!r} - adjust{plan.spec_at(now)}"
        return [float(balance) for balance in self._call(self._script, plan.lua, plan.keys, argument)]

    def close(self) -> None:
        self._held.close()
        self.client.close()
        if self.batch_client is not self.client:
            self.batch_client.close()
        self._async_clients.clear()  # their connections go with their loops

    def ping(self) -> None:
        self._call(self.client.ping)  # within the timeout; at once while the breaker is open

    def health(self) -> list[Health]:
        return [self.breaker.health(self.name)]

    def run_script(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Another Lua script on this server (EVALSHA, loaded when missing), through this
        store's breaker: a cluster's shared budgets call their pools so."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts.setdefault(source, self.client.register_script(source))
        return self._call(script, keys=list(keys), args=list(args))

    def call_script(
        self, lua: LuaLibrary, keys: Sequence[str], tail: bytes, count: int, asking: bool = False, hops: int = 0
    ) -> Any:
        """One call of `lua` with `keys` and `tail`, its `count` arguments packed (`bulk`),
        through this store's breaker; after ASKING when `asking` (a slot on its way to this
        node). A cluster sends here the calls another node redirected."""
        return self._call(self._fcall, lua, keys, tail, count, {}, asking, hops)

    # --- one script call ------------------------------------------------------------------

    def _script(self, lua: LuaLibrary, keys: Sequence[str], *args: str) -> Any:
        """One call of `lua` on `keys` with `args`, on a held connection."""
        return self._fcall(lua, keys, b"".join(bulk(arg.encode()) for arg in args), len(args), {})

    def _fcall(
        self,
        lua: LuaLibrary,
        keys: Sequence[str],
        tail: bytes,
        count: int,
        packed: dict[bool, bytes],
        asking: bool = False,
        hops: int = 0,
    ) -> Any:
        """Send the call: FCALL of `lua`'s function (EVALSHA of its script on a server without
        functions), `keys`, then `tail`, the `count` arguments packed. `packed` keeps the
        command up to `tail`, for the next call with the same keys. A call that ran nothing
        because the library (or script) was missing, or FCALL is unknown, is put right and
        sent again: it cannot count a decision twice. A call redirected by a cluster node
        (MOVED, ASK), which ran nothing either, goes to `redirect`."""
        held = self._held
        for attempt in range(NOSCRIPT_TRIES + 1):
            scripts_only = self._scripts_only
            start = packed.get(scripts_only)
            if start is None:
                if scripts_only:
                    start = script_call_start(b"EVALSHA", lua.sha.encode(), keys, count)
                else:
                    start = script_call_start(b"FCALL", lua.function.encode(), keys, count)
                packed[scripts_only] = start
            try:
                if asking:
                    return held.call(ASKING + start + tail, 2)
                return held.call(start + tail)
            except AskError as error:  # MovedError is one too
                return self._redirected(error, lua, keys, tail, count, hops)
            except ResponseError as error:
                if attempt == NOSCRIPT_TRIES or not self._did_not_run(scripts_only, error):
                    raise
                self._put_right(lua, scripts_only, error)

    def _redirected(
        self, error: AskError, lua: LuaLibrary, keys: Sequence[str], tail: bytes, count: int, hops: int
    ) -> Any:
        if self.redirect is None:
            raise StoreUnavailable(f"{self.name} answered {error}: a cluster node (a redis-cluster:// URL reaches one)")
        if hops >= MOST_REDIRECTS:
            raise StoreUnavailable(f"the keys' slot kept moving ({hops} redirects)")
        return self.redirect(error, lua, keys, tail, count, hops + 1)

    @staticmethod
    def _did_not_run(scripts_only: bool, error: ResponseError) -> bool:
        """Whether `error`, the answer to a call, says that nothing ran because what it calls
        is missing from the server."""
        if scripts_only:
            return isinstance(error, NoScriptError)
        return str(error).startswith(("Function not found", "unknown command"))

    def _put_right(self, lua: LuaLibrary, scripts_only: bool, error: ResponseError) -> None:
        """Load what was missing; on a server without functions, go over to EVALSHA."""
        if scripts_only:
            self.client.script_load(lua.script)
        elif str(error).startswith("unknown command"):
            self.client.script_load(lua.script)
            self._scripts_only = True
        else:
            # REPLACE: two processes loading the same library at once must both succeed;
            # the name holds the source's hash, so what it replaces is the same code.
            self.client.execute_command("FUNCTION", "LOAD", "REPLACE", lua.source)

    async def _afcall(self, lua: LuaLibrary, keys: Sequence[str], argument: bytes) -> Any:
        """`_fcall` on this event loop's asyncio client: FCALL (or EVALSHA), the library
        loaded again when the server lost it, a cluster node's redirect followed; the last
        two, rare, in a thread."""
        client = self.async_client()
        for attempt in range(NOSCRIPT_TRIES + 1):
            scripts_only = self._scripts_only
            name, script = ("EVALSHA", lua.sha) if scripts_only else ("FCALL", lua.function)
            try:
                return await client.execute_command(name, script, len(keys), *keys, argument)
            except AskError as error:  # MovedError is one too
                return await asyncio.to_thread(self._redirected, error, lua, keys, bulk(argument), 1, 0)
            except ResponseError as error:
                if attempt == NOSCRIPT_TRIES or not self._did_not_run(scripts_only, error):
                    raise
                await asyncio.to_thread(self._put_right, lua, scripts_only, error)

    def async_client(self) -> redis.asyncio.Redis:
        """The running event loop's asyncio client, with this store's timeouts and no retries
        (its connections are that loop's); the clients of loops closed since are dropped."""
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            with self._async_lock:
                for closed in [other for other in self._async_clients if other.is_closed()]:
                    del self._async_clients[closed]
                client = self._async_clients[loop] = self._new_async_client()
        return client

    def _new_async_client(self) -> redis.asyncio.Redis:
        options: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "retry": AsyncRetry(NoBackoff(), 0),
            "health_check_interval": 0,
            "max_connections": MAX_CONNECTIONS,
        }
        if self.url:
            return redis.asyncio.Redis.from_url(self.url, **options)
        # A store given only a client: connect where its pool does.
        pool = self.client.connection_pool
        given = pool.connection_kwargs
        names = ("host", "port", "db", "username", "password")
        where: dict[str, Any] = {name: given[name] for name in names if name in given}
        if "path" in given:
            where["unix_socket_path"] = given["path"]
        if issubclass(pool.connection_class, redis.SSLConnection):
            where["ssl"] = True
        return redis.asyncio.Redis(**where, **options)

    async def _acall(self, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """`_call` for a coroutine: the same breaker, the same errors."""
        breaker = self.breaker
        if not breaker.allows():
            raise self._refused()
        try:
            result = await function(*args)
        except RedisError as error:
            breaker.failed()  # as in _call: any driver error means no decision now
            raise StoreUnavailable(f"Redis cannot decide: {error}") from error
        except BaseException:
            breaker.interrupted()  # a cancelled coroutine too: the next probe may go
            raise
        breaker.succeeded()
        return result

    def _refused(self) -> StoreUnavailable:
        """What a call that the open breaker refuses raises: nothing was sent."""
        return StoreUnavailable(f"{self.name} is unreachable; waiting before trying again", sent=False)

    def _call(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """`function` through this store's breaker: StoreUnavailable at once while it is
        open, and for any driver error, which it counts."""
        breaker = self.breaker
        if not breaker.allows():
            raise self._refused()
        try:
            result = function(*args, **kwargs)
        except RedisError as error:
            # Any driver error, not only a lost connection (out of memory, a read-only
            # replica, a server still loading), means this store cannot decide right now:
            # the limiter's fail modes handle it, and the breaker stops us insisting.
            breaker.failed()
            raise StoreUnavailable(f"Redis cannot decide: {error}") from error
        except BaseException:
            breaker.interrupted()  # whatever happened, the next probe may go
            raise
        breaker.succeeded()
        return result


def decision_of(reply: Any, lease: str | None) -> Decision | Finding:
    """A decision's reply: the room left alone (every rule took, nothing else to say) is
    the allowed Decision itself, unless a lease was taken (the limiter names it); else
    outcome_of."""
    if reply.__class__ is not list and lease is None:
        return allowed(float(reply))
    return outcome_of(reply)


def outcome_of(reply: Any) -> Finding:
    """A decision's reply as a Finding: the script sends the room left alone when every
    rule took, no shadow rule would have denied and no soft rule went over; else the fields
    (a denial's without `over`: it took nothing)."""
    if reply.__class__ is not list:
        return found(-1, 0.0, float(reply))
    over = tuple(reply[4]) if len(reply) > 4 else ()
    return found(reply[0], float(reply[1]), float(reply[2]), tuple(reply[3]), over)


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


__all__ = [
    "CircuitBreaker",
    "RedisPlan",
    "RedisStore",
    "connect",
    "decision_of",
    "lua_body",
    "lua_source",
    "outcome_of",
    "redis_plan",
]
