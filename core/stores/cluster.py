"""The Redis Cluster store: the Redis store's scripts, with a key layout that keeps every
decision on one node.

A Lua call may only touch keys of one hash slot, and a decision touches a key at every level.
So every key of one decision carries the same hash tag, a shard id:

- the shard comes from the key of the `shard_by` level (the team, by default): a team's
  keys and its users' keys live together, and teams spread over the shards;
- a level in `split` (the global level, by default) has one key for everybody, which would be
  one hot slot on one node. `global_mode` says how it is shared:
  - "lease" (the default, lease.py): one pool key, from which each process leases slices
    and decides that level locally; its token buckets only (any other rule there is split);
  - "split": `shards` sub-buckets, one per shard, each with 1/shards of every scaled
    parameter (capacity, rate, watermark floor). A decision takes from its own shard's
    sub-bucket. The sum of the sub-buckets is the global limit, so it is never exceeded; the
    price is that a busy shard can deny while others still have room.
- a decision with no key to shard by (only split levels) goes to the shards in turn.

Keys look like `prefix:{s7}:level:key:rule`; a user's key also names its team
(`prefix:{s7}:user:u1@acme:rule`) and lives on its team's shard, so a user seen with two
teams (or with none) has a bucket for each. Shard by the user (`shard_by="user"`) where users
must be limited across teams; the team level then needs to be split too, or be the only
level each decision names.

Each shard has a circuit breaker of its own: when a node is unreachable, the decisions whose
shard lives there get their levels' fail modes, and the other shards go on as before.
MOVED and ASK redirects are followed by redis-py's cluster client; after a primary fails
over, the client learns the new topology on the next error from the old one.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, final
from urllib.parse import urlsplit

from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster, key_slot
from redis.exceptions import (
    AskError,
    ConnectionError,
    MovedError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TimeoutError,
)
from redis.retry import Retry

from ..buckets import bucket_state
from ..decision import Decision
from ..errors import ConfigError
from .base import Check, Outcome
from .connections import bulk, held_connections
from .lease import (
    DEFAULT_FRACTION,
    DEFAULT_INTERVAL,
    LEASE_SCRIPT,
    Budget,
    LeasedPlan,
    leasable,
)
from .redis import (
    BATCH_TIMEOUT,
    DEFAULT_TIMEOUT,
    MAX_CONNECTIONS,
    NOSCRIPT_TRIES,
    CircuitBreaker,
    RedisPlan,
    RedisStore,
    rule_tag,
)

DEFAULT_SHARDS = 16
# At most one topology refresh per this many seconds, per store.
REFRESH_EVERY = 0.1
# How a split level's limit is shared: sub-buckets per shard, or slices leased per process.
# Lease is the default: as fast as the split (bench/cluster.py), and it lets the whole limit
# through however the traffic falls over the shards, where the split lets a busy shard's
# 1/shards through (docs/SCALING.md).
GLOBAL_MODES = ("split", "lease")


@final  # so that `type(plan) is LeasedPlan` tells the two kinds of plan apart, for mypy too
class ClusterPlan(RedisPlan):
    """A plan on one shard, or, when nothing picks a shard, one plan per shard taken in turn."""

    __slots__ = ("shard", "turns", "variants")
    shard: int
    turns: Iterator[int]
    variants: list[ClusterPlan]

    def pick(self) -> ClusterPlan:
        return self.variants[next(self.turns) % len(self.variants)] if self.variants else self


class ClusterStore(RedisStore):
    """Rule state in a Redis Cluster; see the module's docstring for the key layout.

    Its plans are ClusterPlans, or LeasedPlans where a level's budget is leased: its methods
    take only the plans it prepared, narrower than the Redis store's (hence the ignored
    `override` errors: a store's plan is opaque to the limiter, which hands each store its own).
    """

    client: RedisCluster
    batch_client: RedisCluster

    def __init__(
        self,
        url: str | None = None,
        client: RedisCluster | None = None,
        prefix: str = "la",
        timeout: float = DEFAULT_TIMEOUT,
        shards: int = DEFAULT_SHARDS,
        shard_by: str = "team",
        split: Sequence[str] = ("global",),
        breaker: CircuitBreaker | None = None,
        batch_timeout: float = BATCH_TIMEOUT,
        global_mode: str = "lease",
        lease_fraction: float = DEFAULT_FRACTION,
        lease_interval: float = DEFAULT_INTERVAL,
        lease_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_options(shards, global_mode, lease_fraction, lease_interval)
        if client is None:
            client = connect_cluster(url or "", timeout)
            # Batches read their answers on connections of their own, with a longer wait.
            batch_client = connect_cluster(url or "", timeout, max(timeout, batch_timeout))
        else:
            batch_client = client
        self._current = threading.local()  # the breaker of the shard this thread calls
        super().__init__(client=client, prefix=prefix, timeout=timeout, breaker=breaker, batch_client=batch_client)
        # Script calls go out as FCALL on connections held per node (_script), not through
        # the cluster client's command path.
        self._head = self._fcall_head
        self._refreshing, self._refreshed = threading.Lock(), 0.0
        self.shards, self.shard_by, self.split = shards, shard_by, frozenset(split)
        self.breakers = [CircuitBreaker() for _ in range(shards)]
        self.global_mode = global_mode
        self.lease_fraction, self.lease_interval, self.lease_clock = lease_fraction, lease_interval, lease_clock
        self.pool_breaker = CircuitBreaker()  # the leased pools' keys, wherever they live
        self._budgets: dict[str, Budget] = {}
        self._lease_script = client.register_script(LEASE_SCRIPT)

    # --- key layout ---------------------------------------------------------------------

    def shard_of(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.shards

    def key_name(self, level: str, key: str, rule: Any, shard: int = 0) -> str:
        return f"{self.prefix}:{{s{shard}}}:{level}:{key}:{rule_tag(rule)}"

    def prepare(self, checks: Sequence[Check]) -> ClusterPlan | LeasedPlan:  # type: ignore[override]
        if self.global_mode == "lease":
            leased = [i for i, c in enumerate(checks) if c.level in self.split and leasable(c)]
            if leased:
                return self._prepare_leased(checks, leased)
        return self._prepare_split(checks)

    def _prepare_split(self, checks: Sequence[Check]) -> ClusterPlan:
        # One shard needs no scoping: everything is on it, as on a single Redis.
        owner = next((c.key for c in checks if c.level == self.shard_by), None) if self.shards > 1 else None
        by = owner or next((c.key for c in checks if c.level not in self.split), None)
        if by is not None:
            return self._prepare_on(checks, self.shard_of(by), owner)
        plan = self._prepare_on(checks, 0, None)
        plan.variants = [self._prepare_on(checks, shard, None) for shard in range(self.shards)]
        return plan

    def _prepare_on(self, checks: Sequence[Check], shard: int, owner: str | None) -> ClusterPlan:
        """The plan on one shard: split levels' rules at 1/shards; the other levels' keys
        (users) scoped by the `shard_by` key (`owner`, their team) when there is one."""
        fraction = 1 / self.shards
        local = [
            Check(c.level, c.key, c.rule.scaled(fraction), c.floor * fraction)
            if c.level in self.split and self.shards > 1
            else c
            for c in checks
        ]
        base = super().prepare(local)
        plan = ClusterPlan.__new__(ClusterPlan)
        plan.keys = tuple(
            self.key_name(
                c.level,
                c.key if owner is None or c.level in self.split or c.level == self.shard_by else f"{c.key}@{owner}",
                c.rule,
                shard,
            )
            for c in checks
        )
        plan.key_count, plan.spec, plan.checks = base.key_count, base.spec, base.checks
        plan.leased, plan.optimistic = base.leased, base.optimistic
        plan.shard, plan.turns, plan.variants = shard, itertools.count(), []
        return plan

    # --- calls, each on its shard's breaker -------------------------------------------------

    def decide(  # type: ignore[override]
        self, plan: ClusterPlan | LeasedPlan, cost: float, now: float | None, lease: str | None
    ) -> Outcome:
        if type(plan) is LeasedPlan:
            return self._leased(plan, cost, now, lambda inner: self.decide(inner, cost, now, lease))
        plan = plan.pick()
        return self._on(plan.shard, super().decide, plan, cost, now, lease)

    def release(self, plan: ClusterPlan | LeasedPlan, now: float | None, lease: str) -> int:  # type: ignore[override]
        if type(plan) is LeasedPlan:
            return self.release(plan.inner, now, lease) if plan.leased else 0
        return self._on(plan.shard, super().release, plan, now, lease)

    def reserve(  # type: ignore[override]
        self, plan: ClusterPlan | LeasedPlan, cost: float, now: float, lease: str | None, record: dict
    ) -> Outcome:
        if type(plan) is LeasedPlan:
            return self._leased(
                plan, cost, now, lambda inner: self.reserve(inner, cost, now, lease, record), always=True
            )
        plan = self._variant(plan, record["id"])
        return self._on(plan.shard, super().reserve, plan, cost, now, lease, record)

    def settle(  # type: ignore[override]
        self, plan: ClusterPlan | LeasedPlan, reservation_id: str, actual_cost: float | None, now: float | None
    ) -> tuple[float, int]:
        if type(plan) is LeasedPlan:
            delta, released = self.settle(plan.inner, reservation_id, actual_cost, now)
            for _, budget in plan.budgets:  # as settle.lua: rules that count cost, by the difference
                if not budget.counts_requests:
                    budget.give(-delta)
            return delta, released
        plan = self._variant(plan, reservation_id)
        return self._on(plan.shard, super().settle, plan, reservation_id, actual_cost, now)

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        if _shard_of_id(reservation_id, self.shards) is None:
            return None
        return super().reservation(reservation_id, now)

    def inspect(self, plan: ClusterPlan | LeasedPlan, now: float | None) -> list[dict]:  # type: ignore[override]
        """A split level's key without a shard: every sub-bucket, added up (room and
        capacity summed, the longest time to full). A leased one: its pool and this
        process's slice."""
        if type(plan) is LeasedPlan:
            return self._with_budgets(
                plan,
                self.inspect(plan.inner, now) if plan.inner.keys else [],
                lambda budget: self._pool_state(budget, now),
            )
        if not plan.variants:
            return super().inspect(plan, now)
        rows = [super(ClusterStore, self).inspect(variant, now) for variant in plan.variants]
        return [_combine(states) for states in zip(*rows)]

    def explain(  # type: ignore[override]
        self, plan: ClusterPlan | LeasedPlan, cost: float, now: float | None
    ) -> list[tuple[float, float]]:
        if type(plan) is not LeasedPlan:
            return super().explain(plan.pick(), cost, now)

        def row(budget: Budget) -> tuple[float, float]:
            room = self._pool_state(budget, now)["remaining"]
            amount = 1.0 if budget.counts_requests else cost
            return (0.0 if room >= amount else math.inf if amount > budget.capacity else budget.interval), room

        return self._with_budgets(plan, self.explain(plan.inner, cost, now) if plan.inner.keys else [], row)

    def reset(self, plan: ClusterPlan | LeasedPlan) -> None:  # type: ignore[override]
        if type(plan) is LeasedPlan:
            for _, budget in plan.budgets:
                budget.allowance = 0.0
                self._on_pools(self.client.delete, budget.key)
            return self.reset(plan.inner)
        for variant in plan.variants or [plan]:
            super().reset(variant)

    def client_for(self, key: str | None = None) -> Any:
        """The plain client of the primary that holds `key`'s slot (any primary for none):
        transactions, WATCH and multi-key reads, which the cluster client does not do."""
        if key is None:
            return self.client.get_redis_connection(self.client.get_random_node())
        return self.client.get_redis_connection(self.client.get_node_from_key(key))

    # --- the leased global budget (lease.py) ------------------------------------------------

    def _prepare_leased(self, checks: Sequence[Check], leased: list[int]) -> LeasedPlan:
        rest = [i for i in range(len(checks)) if i not in leased]
        inner = self._prepare_split([checks[i] for i in rest])
        budgets = []
        for i in leased:
            check = checks[i]
            key = f"{self.prefix}:{{{check.level}:{check.key}}}:{rule_tag(check.rule)}:pool"
            budget = self._budgets.get(key)
            if budget is None:
                budget = self._budgets.setdefault(
                    key,
                    Budget(key, check.rule, self._lease, self.lease_fraction, self.lease_interval, self.lease_clock),
                )
            budgets.append((i, budget))
        return LeasedPlan(list(checks), budgets, inner, rest)

    def _leased(
        self, plan: LeasedPlan, cost: float, now: float | None, inner_call: Callable, always: bool = False
    ) -> Outcome:
        """Take from every leased slice (denying at the first that cannot give), then let
        Redis decide the other levels; a denial there, or an error, gives the slices back."""
        taken: list[tuple[Budget, float]] = []
        room = math.inf
        try:
            for index, budget in plan.budgets:
                amount = 1.0 if budget.counts_requests else cost
                ok, wait, left = self._on_pools(budget.take, amount, now)
                if not ok:
                    _give_back(taken)
                    return index, wait, left, ()
                taken.append((budget, amount))
                room = min(room, left)
            if not plan.inner.keys and not always:
                return -1, 0.0, room, ()
            outcome = inner_call(plan.inner)
        except BaseException:
            _give_back(taken)
            raise
        if type(outcome) is not Decision and outcome[0] >= 0:
            _give_back(taken)
        return outcome if type(outcome) is Decision else plan.outcome(outcome)

    def _lease(
        self, key: str, now: float | None, capacity: float, rate: float, want: float, need: float, give_back: float
    ) -> tuple[float, float, float]:
        at = "-" if now is None else repr(now)
        granted, pool, wait = self._lease_script(
            keys=[key], args=[at, repr(capacity), repr(rate), repr(want), repr(need), repr(give_back)]
        )
        return float(granted), float(pool), float(wait)

    def _pool_state(self, budget: Budget, now: float | None) -> dict:
        """The pool as it is now (taking nothing), plus what is left of this process's slice."""
        _, pool, _ = self._on_pools(self._lease, budget.key, now, budget.capacity, budget.rate, 0.0, 0.0, 0.0)
        # The slice's allowance is below zero while a settled charge is in debt.
        tokens = min(budget.capacity, pool + budget.allowance)
        return {**bucket_state(tokens, budget.capacity, budget.rate), "leased": True}

    def _with_budgets(self, plan: LeasedPlan, inner_rows: list, row: Callable) -> list:
        rows: list = [None] * len(plan.checks)
        for i, found in zip(plan.inner_index, inner_rows):
            rows[i] = found
        for i, budget in plan.budgets:
            rows[i] = row(budget)
        return rows

    def _on_pools(self, method: Callable, *args: Any) -> Any:
        """`method` with the pools' breaker: a pool's node down fails leased levels only."""
        self._current.breaker = self.pool_breaker
        try:
            return self._call(method, *args)
        finally:
            self._current.breaker = None

    # --- one call: FCALL on the node that holds the slot ------------------------------------

    def _script(self, keys: Sequence[str], *args: str) -> Any:
        """FCALL, packed, on a connection held for the primary that holds the keys' slot (as
        the cluster client last saw the slots). A call that ran nothing is put right and sent
        again: the library missing on that node (loaded there), or the slot moved (MOVED,
        ASK: sent through the cluster client, which follows it and learns the new owner). A
        node that cannot be reached makes the cluster client read the topology again, so
        the next call finds the replica that took over."""
        count = len(args)
        tail = b"".join(bulk(arg.encode()) for arg in args)
        command = (
            b"*%d\r\n" % (3 + len(keys) + count)
            + self._fcall_head
            + bulk(b"%d" % len(keys))
            + b"".join(bulk(key.encode()) for key in keys)
            + tail
        )
        for attempt in range(NOSCRIPT_TRIES + 1):
            try:
                node = self._node_of(keys[0]) if keys else self.client.get_random_node()
                connection = self.client.get_redis_connection(node)
            except RedisClusterException as error:  # no node known for the slot: as if down
                raise ConnectionError(f"no node for the keys' slot: {error}") from error
            try:
                return held_connections(connection.connection_pool).call(command)
            except (MovedError, AskError):
                return self._redirected(keys, args)
            except ResponseError as error:
                if attempt == NOSCRIPT_TRIES or not self._did_not_run(self._fcall_head, error):
                    raise
                self._put_right(self._fcall_head, error, connection)
            except (ConnectionError, TimeoutError):
                self._learn_topology(node.name)
                raise

    def _redirected(self, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Through the cluster client, which follows MOVED and ASK; the node it lands on may
        not have the library yet (it was loaded where calls went so far): load it on every
        primary and call again (a call that found no function ran nothing)."""
        for attempt in range(NOSCRIPT_TRIES + 1):
            try:
                return self.client.execute_command("FCALL", self.function, len(keys), *keys, *args)
            except ResponseError as error:
                if attempt == NOSCRIPT_TRIES or not self._did_not_run(self._fcall_head, error):
                    raise
                self._put_right(self._fcall_head, error, self.client)  # on every primary

    def _node_of(self, key: str) -> Any:
        nodes = self.client.nodes_manager.slots_cache.get(key_slot(key.encode()))
        return nodes[0] if nodes else self.client.get_node_from_key(key)

    def _learn_topology(self, failed: str) -> None:
        """Read the slots again from a node that answers, `failed` last (as redis-py does
        after an error), unless another thread of this store is at it or did so in the last
        REFRESH_EVERY seconds: the callers that fail meanwhile get their fail modes at once."""
        if not self._refreshing.acquire(blocking=False):
            return
        try:
            if time.monotonic() - self._refreshed < REFRESH_EVERY:
                return
            self.client.nodes_manager.initialize(last_failed_node_name=failed)
        except (RedisError, RedisClusterException):
            pass  # nothing answers: a later error tries again
        finally:
            self._refreshed = time.monotonic()
            self._refreshing.release()

    # --- batches: one pipeline per node ----------------------------------------------------

    def decide_many(self, items: Sequence[tuple]) -> list:
        """As on one Redis, with each plan that has no shard taking the next in turn. Leased
        plans are decided alone, in their turn (their slices are local)."""
        return super().decide_many(
            [(plan if type(plan) is LeasedPlan else plan.pick(), *rest) for plan, *rest in items]
        )

    def _evalsha_many(self, calls: list[tuple[tuple, str]], client: Any = None) -> list:
        """The cluster client does not pipeline scripts, so the batch is grouped by node and
        each node's calls go down the single store's pipeline (FCALL, a missing library
        loaded there and what did not run sent again) on that node's own connection, in
        order (decisions that share keys share a slot, so their order is kept). One round
        trip per node. A node that cannot be reached fails its own calls; a MOVED or ASK (a
        slot moved since the topology was read) is sent again alone through the cluster
        client, which follows it."""
        answers: list = [None] * len(calls)
        for node, entries in self._by_node(calls, answers).items():
            try:
                replies = super()._evalsha_many(
                    [calls[i] for i in entries], self.batch_client.get_redis_connection(node)
                )
            except RedisError as error:
                replies = [error] * len(entries)
            for i, reply in zip(entries, replies):
                if isinstance(reply, (MovedError, AskError)):
                    try:
                        reply = self._redirected(calls[i][0], (calls[i][1],))
                    except RedisError as error:
                        reply = error
                answers[i] = reply
        return answers

    def _by_node(self, calls: list, answers: list) -> dict:
        """The calls by the node that holds their slot, each node's in order."""
        nodes: dict = {}
        for i in range(len(calls)):
            try:
                node = self.batch_client.get_node_from_key(calls[i][0][0])
            except RedisError as error:  # a slot no node covers now
                answers[i] = error
                continue
            nodes.setdefault(node.name, (node, []))[1].append(i)
        return {node: entries for node, entries in nodes.values()}

    # --- reservations: the id names its shard, so that its record lives with its keys ------

    def new_reservation_id(self, plan: ClusterPlan | LeasedPlan) -> str:
        inner = plan.inner if type(plan) is LeasedPlan else plan
        return f"{super().new_reservation_id(plan)}.{inner.pick().shard}"

    def reservation_key(self, reservation_id: str) -> str:
        shard = _shard_of_id(reservation_id, self.shards)
        return f"{self.prefix}:{{s{shard}}}:reservation:{reservation_id}"

    def _variant(self, plan: ClusterPlan, reservation_id: str) -> ClusterPlan:
        shard = _shard_of_id(reservation_id, self.shards)
        if plan.variants and shard is not None:
            return plan.variants[shard]
        return plan

    # --- the shard's breaker stands in for the store's while a call runs ------------------

    @property
    def breaker(self) -> CircuitBreaker:
        return getattr(self._current, "breaker", None) or self._breaker

    @breaker.setter
    def breaker(self, value: CircuitBreaker) -> None:
        self._breaker = value

    def _on(self, shard: int, method: Callable, *args: Any) -> Any:
        """`method` with this shard's breaker as `self.breaker`: a dead node opens the
        breakers of its own shards only."""
        self._current.breaker = self.breakers[shard]
        try:
            return method(*args)
        finally:
            self._current.breaker = None


def _give_back(taken: list) -> None:
    for budget, amount in taken:
        budget.give(amount)


def _combine(states: Sequence[dict]) -> dict:
    """One rule's state over its sub-buckets: times (`..._in`, `..._at`) the longest,
    other numbers summed, anything else as the first sub-bucket says."""
    combined = dict(states[0])
    for name, value in combined.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [state[name] for state in states]
            combined[name] = max(values) if name.endswith(("_in", "_at")) else sum(values)
    return combined


def _shard_of_id(reservation_id: str, shards: int) -> int | None:
    """The shard a reservation id names after its last dot; None if it names none."""
    _, dot, shard = reservation_id.rpartition(".")
    if not dot or not shard.isdigit() or int(shard) >= shards:
        return None
    return int(shard)


def check_options(
    shards: Any = DEFAULT_SHARDS,
    global_mode: Any = "lease",
    lease_fraction: Any = DEFAULT_FRACTION,
    lease_interval: Any = DEFAULT_INTERVAL,
) -> None:
    """ConfigError naming the first bad option (before anything connects)."""
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= 16384:
        raise ConfigError("must be a whole number from 1 to 16384", "shards")
    if global_mode not in GLOBAL_MODES:
        raise ConfigError(f"must be one of {', '.join(GLOBAL_MODES)}, not {global_mode!r}", "global_mode")
    if not (isinstance(lease_fraction, (int, float)) and 0 < lease_fraction <= 1):
        raise ConfigError("must be a number above 0 and at most 1", "lease_fraction")
    if not (isinstance(lease_interval, (int, float)) and 0 < lease_interval <= 3600):
        raise ConfigError("must be a number of seconds above 0 and at most 3600", "lease_interval")


def parse_cluster_url(url: str) -> list[tuple[str, int]]:
    """The startup nodes of `redis-cluster://host:port[,host:port...]`; ConfigError if bad."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme != "redis-cluster" or not parts.netloc:
        raise ConfigError(f"expected redis-cluster://host:port[,host:port...], not {url!r}", "store")
    nodes = []
    for address in parts.netloc.split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{address!r} is not host:port", "store")
        nodes.append((host, int(port)))
    return nodes


def connect_cluster(url: str, timeout: float = DEFAULT_TIMEOUT, read_timeout: float | None = None) -> RedisCluster:
    """A cluster client from `redis-cluster://host:port[,host:port...]` that gives up fast:
    `timeout` to connect, `read_timeout` (default: `timeout`) for an answer."""
    nodes = [ClusterNode(host, port) for host, port in parse_cluster_url(url)]
    return RedisCluster(
        startup_nodes=nodes,
        socket_timeout=read_timeout or timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        max_connections=MAX_CONNECTIONS,
        require_full_coverage=False,
    )
