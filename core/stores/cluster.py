"""The Redis Cluster store: the Redis store's scripts, with a key layout that keeps every
decision on one node.

A Lua call may only touch keys of one hash slot, and a decision touches a key at every level.
So every key of one decision carries the same hash tag, a shard id:

- the shard comes from the key of the `shard_by` level (the team, by default): a team's
  keys and its users' keys live together, and teams spread over the shards;
- a level in `split` (the global level, by default) has one key for everybody, which would be
  one hot slot on one node. It is split into `shards` sub-buckets, one per shard, each with
  1/shards of every scaled parameter (capacity, rate, watermark floor). A decision takes from
  its own shard's sub-bucket. The sum of the sub-buckets is the global limit, so it is never
  exceeded; the price is that a busy shard can deny while others still have room.
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
import threading
import zlib
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.retry import Retry

from ..errors import ConfigError, StoreUnavailable
from .base import Check, Outcome
from .redis import (BATCH_TIMEOUT, DEFAULT_TIMEOUT, MAX_CONNECTIONS, NOSCRIPT_TRIES, CircuitBreaker, RedisPlan,
                    RedisStore, _base36)

DEFAULT_SHARDS = 16


class ClusterPlan(RedisPlan):
    """A plan on one shard, or, when nothing picks a shard, one plan per shard taken in turn."""

    __slots__ = ("shard", "turns", "variants")

    def pick(self) -> "ClusterPlan":
        return self.variants[next(self.turns) % len(self.variants)] if self.variants else self


class ClusterStore(RedisStore):
    """Rule state in a Redis Cluster; see the module's docstring for the key layout."""

    def __init__(self, url: str | None = None, client: RedisCluster | None = None,
                 prefix: str = "la", timeout: float = DEFAULT_TIMEOUT, shards: int = DEFAULT_SHARDS,
                 shard_by: str = "team", split: Sequence[str] = ("global",),
                 breaker: CircuitBreaker | None = None, batch_timeout: float = BATCH_TIMEOUT) -> None:
        if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= 16384:
            raise ConfigError("must be a whole number from 1 to 16384", "shards")
        if client is None:
            client = connect_cluster(url or "", timeout)
            # Batches read their answers on connections of their own, with a longer wait.
            batch_client = connect_cluster(url or "", timeout, max(timeout, batch_timeout))
        else:
            batch_client = client
        self._current = threading.local()  # the breaker of the shard this thread calls
        super().__init__(client=client, prefix=prefix, timeout=timeout, breaker=breaker,
                         batch_client=batch_client)
        self.shards, self.shard_by, self.split = shards, shard_by, frozenset(split)
        self.breakers = [CircuitBreaker() for _ in range(shards)]

    # --- key layout ---------------------------------------------------------------------

    def shard_of(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.shards

    def key_name(self, level: str, key: str, rule: Any, shard: int = 0) -> str:
        tag = _base36(zlib.crc32(rule.rule_id.encode()))
        return f"{self.prefix}:{{s{shard}}}:{level}:{key}:{tag}"

    def prepare(self, checks: Sequence[Check]) -> ClusterPlan:
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
        local = [Check(c.level, c.key, c.rule.scaled(fraction), c.floor * fraction)
                 if c.level in self.split and self.shards > 1 else c for c in checks]
        base = super().prepare(local)
        plan = ClusterPlan.__new__(ClusterPlan)
        plan.keys = tuple(self.key_name(c.level, c.key if owner is None or c.level in self.split
                                        or c.level == self.shard_by else f"{c.key}@{owner}",
                                        c.rule, shard) for c in checks)
        plan.key_count, plan.spec, plan.checks = base.key_count, base.spec, base.checks
        plan.leased, plan.optimistic = base.leased, base.optimistic
        plan.shard, plan.turns, plan.variants = shard, itertools.count(), []
        return plan

    # --- calls, each on its shard's breaker -------------------------------------------------

    def decide(self, plan: ClusterPlan, cost: float, now: float | None, lease: str | None) -> Outcome:
        plan = plan.pick()
        return self._on(plan.shard, super().decide, plan, cost, now, lease)

    def release(self, plan: ClusterPlan, now: float | None, lease: str) -> int:
        return self._on(plan.shard, super().release, plan, now, lease)

    def reserve(self, plan: ClusterPlan, cost: float, now: float, lease: str | None,
                record: dict) -> Outcome:
        plan = self._variant(plan, record["id"])
        return self._on(plan.shard, super().reserve, plan, cost, now, lease, record)

    def settle(self, plan: ClusterPlan, reservation_id: str, actual_cost: float | None,
               now: float | None) -> tuple[float, int]:
        plan = self._variant(plan, reservation_id)
        return self._on(plan.shard, super().settle, plan, reservation_id, actual_cost, now)

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        if _shard_of_id(reservation_id, self.shards) is None:
            return None
        return super().reservation(reservation_id, now)

    def inspect(self, plan: ClusterPlan, now: float | None) -> list[dict]:
        """A split level's key without a shard: every sub-bucket, added up (room and
        capacity summed, the longest time to full)."""
        if not plan.variants:
            return super().inspect(plan, now)
        rows = [super(ClusterStore, self).inspect(variant, now) for variant in plan.variants]
        return [_combine(states) for states in zip(*rows)]

    def reset(self, plan: ClusterPlan) -> None:
        for variant in plan.variants or [plan]:
            super().reset(variant)

    def client_for(self, key: str | None = None) -> Any:
        """The plain client of the primary that holds `key`'s slot (any primary for none):
        transactions, WATCH and multi-key reads, which the cluster client does not do."""
        if key is None:
            return self.client.get_redis_connection(self.client.get_random_node())
        return self.client.get_redis_connection(self.client.get_node_from_key(key))

    # --- batches: one pipeline per node ----------------------------------------------------

    def _evalsha_many(self, calls: list[tuple[tuple, str]]) -> list:
        """The cluster client does not pipeline scripts, so the batch is grouped by node and
        each node's calls go down one pipeline on that node's own connection, in order
        (decisions that share keys share a slot, so their order is kept). One round trip per
        node. A node that cannot be reached fails its own calls; NOSCRIPT loads the script
        there and sends again what did not run; a MOVED or ASK (a slot moved since the
        topology was read) is sent again alone through the cluster client, which follows it."""
        answers: list = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in range(NOSCRIPT_TRIES + 1):
            again, moved = [], []
            for node, entries in self._by_node(calls, pending, answers).items():
                connection = self.batch_client.get_redis_connection(node)
                try:
                    if attempt:
                        connection.script_load(self.source)
                    with connection.pipeline(transaction=False) as pipe:
                        for i in entries:
                            keys, argument = calls[i]
                            pipe.evalsha(self.sha, len(keys), *keys, argument)
                        replies = pipe.execute(raise_on_error=False)
                except RedisError as error:
                    for i in entries:
                        answers[i] = error
                    continue
                for i, reply in zip(entries, replies):
                    answers[i] = reply
                    if isinstance(reply, NoScriptError):
                        again.append(i)
                    elif isinstance(reply, ResponseError) and str(reply).startswith(("MOVED", "ASK")):
                        moved.append(i)
            for i in moved:
                try:
                    answers[i] = self._evalsha(*calls[i][0], calls[i][1], keys=len(calls[i][0]))
                except RedisError as error:
                    answers[i] = error
            if not again:
                break
            pending = again
        return answers

    def _by_node(self, calls: list, pending: list[int], answers: list) -> dict:
        """The pending calls by the node that holds their slot, each node's in order."""
        nodes: dict = {}
        for i in pending:
            try:
                node = self.batch_client.get_node_from_key(calls[i][0][0])
            except RedisError as error:  # a slot no node covers now
                answers[i] = error
                continue
            nodes.setdefault(node.name, (node, []))[1].append(i)
        return {node: entries for node, entries in nodes.values()}

    # --- reservations: the id names its shard, so that its record lives with its keys ------

    def new_reservation_id(self, plan: ClusterPlan) -> str:
        return f"{super().new_reservation_id(plan)}.{plan.pick().shard}"

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


def connect_cluster(url: str, timeout: float = DEFAULT_TIMEOUT,
                    read_timeout: float | None = None) -> RedisCluster:
    """A cluster client from `redis-cluster://host:port[,host:port...]` that gives up fast:
    `timeout` to connect, `read_timeout` (default: `timeout`) for an answer."""
    parts = urlsplit(url)
    if parts.scheme != "redis-cluster" or not parts.netloc:
        raise ConfigError(f"expected redis-cluster://host:port[,host:port...], not {url!r}", "store")
    nodes = []
    for address in parts.netloc.split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{address!r} is not host:port", "store")
        nodes.append(ClusterNode(host, int(port)))
    return RedisCluster(startup_nodes=nodes, socket_timeout=read_timeout or timeout,
                        socket_connect_timeout=timeout,
                        retry=Retry(NoBackoff(), 0), max_connections=MAX_CONNECTIONS,
                        require_full_coverage=False)
