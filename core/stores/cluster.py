"""The Redis Cluster store: a router of Redis stores, one per primary, with a key layout that
keeps every decision on one node.

A Lua call may only touch keys of one hash slot, and a decision touches a key at every level.
So every key of one decision carries the same hash tag, a shard id:

- the shard comes from the key of the `shard_by` level (the team, by default): a team's
  keys and its users' keys live together, and teams spread over the shards;
- a level in `split` (the global level, by default) has one key for everybody, which would be
  one hot slot on one node. `global_mode` says how it is shared:
  - "lease" (the default, shares.py): one pool key, from which each process takes shares
    and decides that level locally; shareable rules only (token buckets; any other rule
    there is split). The mode keeps its operators' name, `lease`; it hands out shares;
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

`ClusterRouter` holds one RedisStore per primary, each with its own connections, circuit
breaker and Lua library state, and sends every call (decisions, batches, reads, resets,
reservations, the pools' shares, time, pings) to the store of the node that holds its slot,
so through that node's breaker: when a node is unreachable, the decisions whose shard lives
there get their levels' fail modes, and the other nodes go on as before. Which node holds a
slot it learns from CLUSTER SHARDS (our own map, `SlotMap`), again after a node failed (so it
finds the replica that took over) and one slot at a time from MOVED; ASK is followed for the
one call. `ClusterStore` is the router, behind `SharedBudgets` in lease mode.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import methodcaller
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster, key_slot
from redis.exceptions import AskError, MovedError, RedisError, ResponseError
from redis.retry import Retry

from ..decision import Decision, Finding
from ..errors import ConfigError, StoreUnavailable
from ..reservations import new_reservation_id
from .base import AsyncDecider, Check, Health, Store, Wrapper
from .keeping import rule_tag
from .library import LuaLibrary
from .redis import BATCH_TIMEOUT, DEFAULT_TIMEOUT, MAX_CONNECTIONS, RedisPlan, RedisStore, redis_plan
from .shares import DEFAULT_FRACTION, DEFAULT_INTERVAL, SHARE_SCRIPT, SharedBudgets

DEFAULT_SHARDS = 16
SLOTS = 16384
# At most one topology refresh after a failure per this many seconds, per store.
REFRESH_EVERY = 0.1
# How a split level's limit is shared: sub-buckets per shard ("split"), or shares taken by
# each process from one pool ("lease", its operators' name). Lease is the default: as fast
# as the split (bench/cluster.py), and it lets the whole limit through however the traffic
# falls over the shards, where the split lets a busy shard's 1/shards through
# (docs/SCALING.md).
GLOBAL_MODES = ("split", "lease")

T = TypeVar("T")


class SlotMap:
    """Which primary holds each of the 16,384 slots, as "host:port": from CLUSTER SHARDS (or,
    on a server older than 7, CLUSTER SLOTS), asked of the first node that answers."""

    def __init__(
        self, startup: Sequence[tuple[str, int]], timeout: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.owners: list[str | None] = [None] * SLOTS
        self.timeout, self.clock = timeout, clock
        self._ask = [f"{host}:{port}" for host, port in startup]  # whom to ask, known nodes first
        self._lock = threading.Lock()
        self._refreshed = -REFRESH_EVERY

    def refresh(self, failed: str | None = None, wait: bool = False) -> bool:
        """Read the slots again from a node that answers, `failed` last, unless another thread
        is at it or did it in the last REFRESH_EVERY seconds; with `wait`, wait for the thread
        at it, or read them now. Whether the slots were read."""
        seen = self._refreshed
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            if wait and self._refreshed != seen:
                return True  # another thread read them while this one waited
            if not wait and self.clock() - self._refreshed < REFRESH_EVERY:
                return False  # not a read: the time of the last read stays (failures come faster)
            self._refreshed = self.clock()
            for node in sorted(self._ask, key=lambda name: name == failed):
                ranges = self._read(node)
                if ranges is None:
                    continue
                owners: list[str | None] = [None] * SLOTS
                for start, end, owner in ranges:
                    owners[start : end + 1] = [owner] * (end + 1 - start)
                self.owners = owners
                self._ask = list(dict.fromkeys([*self._ask, *(owner for _, _, owner in ranges)]))
                return True
            return False
        finally:
            self._lock.release()

    def moved(self, slot: int, owner: str) -> None:
        """A node said that `slot` is held by `owner` now (MOVED)."""
        self.owners[slot] = owner

    def primaries(self) -> list[str]:
        """The nodes that hold slots, each once."""
        return list(dict.fromkeys(owner for owner in self.owners if owner is not None))

    def _read(self, node: str) -> list[tuple[int, int, str]] | None:
        """(first slot, last slot, primary) of every range, as `node` sees them; None if it
        does not answer."""
        host, _, port = node.rpartition(":")
        client = redis.Redis(
            host=host,
            port=int(port),
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            try:
                return _shard_ranges(client.execute_command("CLUSTER", "SHARDS"))
            except ResponseError:  # no CLUSTER SHARDS before Redis 7
                return _slot_ranges(client.execute_command("CLUSTER", "SLOTS"))
        except RedisError:
            return None
        finally:
            client.close()


def _fields(reply: Any) -> dict[str, Any]:
    """A RESP map (RESP3) or flat list of names and values (RESP2), with text names."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {name.decode() if isinstance(name, bytes) else name: value for name, value in pairs}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shard_ranges(reply: list) -> list[tuple[int, int, str]]:
    ranges = []
    for entry in reply:
        shard = _fields(entry)
        nodes = [_fields(node) for node in shard["nodes"]]
        primaries = [node for node in nodes if _text(node.get("role")) == "master"]
        live = [node for node in primaries if _text(node.get("health")) == "online"] or primaries
        if not live:
            continue
        node = live[0]
        address = _text(node.get("endpoint") or node.get("ip"))
        if address in ("", "?"):
            address = _text(node.get("ip"))
        owner = f"{address}:{int(node.get('port') or node.get('tls-port') or 0)}"
        slots = shard["slots"]
        ranges += [(int(slots[i]), int(slots[i + 1]), owner) for i in range(0, len(slots), 2)]
    return ranges


def _slot_ranges(reply: list) -> list[tuple[int, int, str]]:
    return [(int(start), int(end), f"{_text(primary[0])}:{int(primary[1])}") for start, end, primary, *_ in reply]


class ShardPlan:
    """A plan on one shard: its keys, the Redis plan the node store runs, and the slot whose
    node runs it; or, when nothing picks a shard, one such plan per shard, taken in turn."""

    __slots__ = ("keys", "redis", "shard", "slot", "turns", "variants", "leased")

    def __init__(self, plan: RedisPlan, shard: int, variants: list[ShardPlan] | None = None) -> None:
        self.redis, self.shard, self.keys, self.leased = plan, shard, plan.keys, plan.leased
        self.slot = key_slot(f"{{s{shard}}}".encode())
        self.turns: Iterator[int] = itertools.count()
        self.variants = variants or []

    def pick(self) -> ShardPlan:
        return self.variants[next(self.turns) % len(self.variants)] if self.variants else self


class ClusterRouter(Store[ShardPlan]):
    """The cluster's shards, each routed to the RedisStore of the primary that holds it (see
    the module's docstring); every call goes through that store, and its breaker."""

    clock = staticmethod(lambda: None)  # None: the scripts read the servers' TIME

    def __init__(
        self,
        url: str,
        prefix: str = "la",
        timeout: float = DEFAULT_TIMEOUT,
        shards: int = DEFAULT_SHARDS,
        shard_by: str = "team",
        split: Sequence[str] = ("global",),
        batch_timeout: float = BATCH_TIMEOUT,
    ) -> None:
        self.slots = SlotMap(parse_cluster_url(url), timeout)
        self.prefix, self.timeout, self.batch_timeout = prefix, timeout, batch_timeout
        self.shards, self.shard_by, self.split = shards, shard_by, frozenset(split)
        self._stores: dict[str, RedisStore] = {}
        self._making = threading.Lock()

    # --- key layout ---------------------------------------------------------------------

    def shard_of(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.shards

    def key_name(self, level: str, key: str, rule: Any, shard: int = 0) -> str:
        return f"{self.prefix}:{{s{shard}}}:{level}:{key}:{rule_tag(rule)}"

    def prepare(self, checks: Sequence[Check]) -> ShardPlan:
        # One shard needs no scoping: everything is on it, as on a single Redis.
        owner = next((c.key for c in checks if c.level == self.shard_by), None) if self.shards > 1 else None
        by = owner or next((c.key for c in checks if c.level not in self.split), None)
        if by is not None:
            return self._prepare_on(checks, self.shard_of(by), owner)
        variants = [self._prepare_on(checks, shard, None) for shard in range(self.shards)]
        return ShardPlan(variants[0].redis, 0, variants)

    def _prepare_on(self, checks: Sequence[Check], shard: int, owner: str | None) -> ShardPlan:
        """The plan on one shard: split levels' rules at 1/shards; the other levels' keys
        (users) scoped by the `shard_by` key (`owner`, their team) when there is one."""
        fraction = 1 / self.shards
        local = [
            Check(c.level, c.key, c.rule.scaled(fraction), c.floor * fraction)
            if c.level in self.split and self.shards > 1
            else c
            for c in checks
        ]
        keys = [
            self.key_name(
                c.level,
                c.key if owner is None or c.level in self.split or c.level == self.shard_by else f"{c.key}@{owner}",
                c.rule,
                shard,
            )
            for c in checks
        ]
        return ShardPlan(redis_plan(local, keys, f"{self.prefix}:{{s{shard}}}:reservation:"), shard)

    # --- the node stores ------------------------------------------------------------------

    def node_of(self, key: str) -> str:
        """The primary ("host:port") that holds `key`'s slot."""
        return self._owner(key_slot(key.encode()))

    def store_of(self, key: str) -> RedisStore:
        """The store of the primary that holds `key`'s slot."""
        return self._store(self.node_of(key))

    def _owner(self, slot: int) -> str:
        owner = self.slots.owners[slot]
        if owner is None:
            self.slots.refresh(wait=True)  # the first call, or a slot no node held last time
            owner = self.slots.owners[slot]
            if owner is None:
                raise StoreUnavailable(f"no node of the cluster holds slot {slot}")
        return owner

    def _store(self, node: str) -> RedisStore:
        store = self._stores.get(node)
        if store is None:
            with self._making:
                store = self._stores.get(node)
                if store is None:
                    store = self._stores[node] = RedisStore(
                        url=f"redis://{node}/0",
                        prefix=self.prefix,
                        timeout=self.timeout,
                        batch_timeout=self.batch_timeout,
                        name=f"Redis Cluster node {node}",
                        redirect=self._redirected,
                    )
        return store

    def _on(self, slot: int, call: Callable[[RedisStore], T]) -> T:
        """`call` on the store of the node that holds `slot`. When it fails, the slots are
        read again (at most every REFRESH_EVERY seconds), so that the calls after it find a
        replica that took over."""
        node = self._owner(slot)
        try:
            return call(self._store(node))
        except StoreUnavailable:
            self.slots.refresh(failed=node)
            raise

    def _redirected(
        self, error: AskError, lua: LuaLibrary, keys: Sequence[str], tail: bytes, count: int, hops: int
    ) -> Any:
        """A call a node redirected: MOVED, the slot is the other node's now (and our map
        learns it); ASK, the slot is on its way there (ASKING, for this call only)."""
        node = f"{error.host}:{error.port}"
        moved = isinstance(error, MovedError)
        if moved:
            self.slots.moved(error.slot_id, node)
        return self._store(node).call_script(lua, keys, tail, count, asking=not moved, hops=hops)

    # --- calls, each through the store of its shard's node -----------------------------------

    def decide(self, plan: ShardPlan, cost: float, now: float, lease: str | None) -> Decision | Finding:
        plan = plan.pick()
        return self._on(plan.slot, lambda store: store.decide(plan.redis, cost, now, lease))

    def decider(self, plan: ShardPlan) -> Callable[[float, float, str | None], Decision | Finding]:
        """The node store's own decider (its command packed once), for the node that holds
        the plan's slot at the time of each call."""
        if plan.variants:
            return partial(self.decide, plan)
        redis_plan, slot, owners = plan.redis, plan.slot, self.slots
        deciders: dict[str, Callable[[float, float, str | None], Decision | Finding]] = {}

        def decide(cost: float, now: float, lease: str | None = None) -> Decision | Finding:
            node = owners.owners[slot] or self._owner(slot)
            decide_on = deciders.get(node)
            if decide_on is None:
                decide_on = deciders[node] = self._store(node).decider(redis_plan)
            try:
                return decide_on(cost, now, lease)
            except StoreUnavailable:
                owners.refresh(failed=node)
                raise

        return decide

    def adecider(self, plan: ShardPlan) -> AsyncDecider:
        """`decider` for coroutines: the node store's own adecider (its asyncio client), for
        the node that holds the plan's slot at the time of each call; reading the slots
        again (after a failure, or for a slot no node held) is done in a thread."""
        if plan.variants:
            return super().adecider(plan)
        redis_plan, slot, owners = plan.redis, plan.slot, self.slots
        deciders: dict[str, AsyncDecider] = {}

        async def adecide(cost: float, now: float, lease: str | None = None) -> Decision | Finding:
            node = owners.owners[slot]
            if node is None:  # the first call, or a slot no node held last time
                node = await asyncio.to_thread(self._owner, slot)
            decide_on = deciders.get(node)
            if decide_on is None:
                decide_on = deciders[node] = self._store(node).adecider(redis_plan)
            try:
                return await decide_on(cost, now, lease)
            except StoreUnavailable:
                await asyncio.to_thread(owners.refresh, node)
                raise

        return adecide

    def decide_many(
        self, items: Sequence[tuple[ShardPlan, float, float, str | None]]
    ) -> list[Decision | Finding | StoreUnavailable]:
        """Each node's share of the batch in one pipeline of its store (one round trip per
        node), in order: decisions that share keys share a slot, so their order is kept. A
        plan with no shard takes the next in turn."""
        results: list = [None] * len(items)
        by_node: dict[str, list[tuple[int, tuple]]] = {}
        for i, (plan, cost, now, lease) in enumerate(items):
            picked = plan.pick()
            try:
                node = self._owner(picked.slot)
            except StoreUnavailable as error:
                results[i] = error
                continue
            by_node.setdefault(node, []).append((i, (picked.redis, cost, now, lease)))
        for node, entries in by_node.items():
            outcomes = self._store(node).decide_many([item for _, item in entries])
            if any(isinstance(outcome, StoreUnavailable) for outcome in outcomes):
                self.slots.refresh(failed=node)
            for (i, _), outcome in zip(entries, outcomes):
                results[i] = outcome
        return results

    def explain(self, plan: ShardPlan, cost: float, now: float) -> list[tuple[float, float]]:
        plan = plan.pick()
        return self._on(plan.slot, lambda store: store.explain(plan.redis, cost, now))

    def inspect(self, plan: ShardPlan, now: float) -> list[dict]:
        """A split level's key without a shard: every sub-bucket, added up (room and
        capacity summed, the longest time to full)."""
        if not plan.variants:
            return self._on(plan.slot, lambda store: store.inspect(plan.redis, now))
        rows = [self._on(v.slot, methodcaller("inspect", v.redis, now)) for v in plan.variants]
        return [_combine(states) for states in zip(*rows)]

    def release(self, plan: ShardPlan, now: float, lease: str) -> int:
        return self._on(plan.slot, lambda store: store.release(plan.redis, now, lease))

    def reset(self, plan: ShardPlan) -> None:
        for variant in plan.variants or [plan]:
            self._on(variant.slot, methodcaller("reset", variant.redis))

    def adjust(self, plan: ShardPlan, now: float, delta: float) -> list[float]:
        """A split level's key without a shard: each sub-bucket its share of `delta` (as each
        holds its share of the limit), one after the other; the balances summed."""
        if not plan.variants:
            return self._on(plan.slot, lambda store: store.adjust(plan.redis, now, delta))
        share = delta / len(plan.variants)
        rows = [self._on(v.slot, methodcaller("adjust", v.redis, now, share)) for v in plan.variants]
        return [sum(balances) for balances in zip(*rows)]

    # --- reservations: the id names its shard, so that its record lives with its keys ------

    def new_reservation_id(self, plan: ShardPlan) -> str:
        return f"{new_reservation_id()}.{plan.pick().shard}"

    def reserve(self, plan: ShardPlan, cost: float, now: float, lease: str | None, record: dict) -> Decision | Finding:
        plan = self._variant(plan, record["id"])
        return self._on(plan.slot, lambda store: store.reserve(plan.redis, cost, now, lease, record))

    def settle(self, plan: ShardPlan, reservation_id: str, actual_cost: float | None, now: float) -> tuple[float, int]:
        plan = self._variant(plan, reservation_id)
        return self._on(plan.slot, lambda store: store.settle(plan.redis, reservation_id, actual_cost, now))

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        shard = _shard_of_id(reservation_id, self.shards)
        if shard is None:
            return None
        key = f"{self.prefix}:{{s{shard}}}:reservation:{reservation_id}"
        return self._on(key_slot(key.encode()), lambda store: store.record(key, now))

    def _variant(self, plan: ShardPlan, reservation_id: str) -> ShardPlan:
        shard = _shard_of_id(reservation_id, self.shards)
        if plan.variants and shard is not None:
            return plan.variants[shard]
        return plan

    # --- the rest --------------------------------------------------------------------------

    def run_script(self, key: str, args: Sequence[Any], source: str = SHARE_SCRIPT) -> Any:
        """A Lua script on the node that holds `key` (a shared budget's pool), through its
        store's breaker."""
        return self._on(key_slot(key.encode()), lambda store: store.run_script(source, [key], args))

    def time(self) -> float:
        """The time of the first primary that answers."""
        return self._first(lambda store: store.time())

    def ping(self) -> None:
        """Every primary must answer."""
        failures = []
        for node in self._primaries():
            try:
                self._store(node).ping()
            except StoreUnavailable as error:
                failures.append(f"{node}: {error}")
        if failures:
            raise StoreUnavailable("; ".join(failures))

    def health(self) -> list[Health]:
        """One part per primary."""
        return [part for node in self._primaries() for part in self._store(node).health()]

    def close(self) -> None:
        for store in list(self._stores.values()):
            store.close()

    def _primaries(self) -> list[str]:
        if not any(self.slots.owners):
            self.slots.refresh(wait=True)
        return self.slots.primaries()

    def _first(self, call: Callable[[RedisStore], T]) -> T:
        failure = StoreUnavailable("no node of the cluster answers")
        for node in self._primaries():
            try:
                return call(self._store(node))
            except StoreUnavailable as error:
                failure = error
        raise failure


class ClusterStore(Wrapper[Any]):
    """Rule state in a Redis Cluster: the router of its shards (ClusterRouter), behind the
    split levels' shared budgets (SharedBudgets) in lease mode; see the module's docstring.

    `global_mode="lease"` (the default), `lease_fraction`, `lease_interval` and `lease_clock`
    keep the names operators know: the mode called `lease` hands out shares of each pool,
    `lease_fraction` of its capacity each, given back after `lease_interval` seconds."""

    def __init__(
        self,
        url: str | None = None,
        prefix: str = "la",
        timeout: float = DEFAULT_TIMEOUT,
        shards: int = DEFAULT_SHARDS,
        shard_by: str = "team",
        split: Sequence[str] = ("global",),
        batch_timeout: float = BATCH_TIMEOUT,
        global_mode: str = "lease",
        lease_fraction: float = DEFAULT_FRACTION,
        lease_interval: float = DEFAULT_INTERVAL,
        lease_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_options(shards, global_mode, lease_fraction, lease_interval)
        self.router = ClusterRouter(url or "", prefix, timeout, shards, shard_by, split, batch_timeout)
        self.global_mode = global_mode
        self.shared_budgets: SharedBudgets | None = None
        if global_mode == "lease":  # the mode's public name: it hands out shares
            self.shared_budgets = SharedBudgets(
                self.router,
                self.router.run_script,
                self.router.split,
                prefix,
                lease_fraction,
                lease_interval,
                lease_clock,
            )
        super().__init__(self.shared_budgets or self.router)

    def adecider(self, plan: Any) -> AsyncDecider:
        return self.inner.adecider(plan)  # the router's, or the shared budgets'

    @property
    def shards(self) -> int:
        return self.router.shards

    @property
    def shard_by(self) -> str:
        return self.router.shard_by

    def shard_of(self, key: str) -> int:
        return self.router.shard_of(key)

    def node_of(self, key: str) -> str:
        return self.router.node_of(key)

    def store_of(self, key: str) -> RedisStore:
        return self.router.store_of(key)


def _combine(states: Sequence[dict]) -> dict:
    """One rule's state over its sub-buckets: times (`..._in`, `..._at`, `..._start`) the
    longest, other numbers summed, anything else as the first sub-bucket says."""
    combined = dict(states[0])
    for name, value in combined.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [state[name] for state in states]
            combined[name] = max(values) if name.endswith(("_in", "_at", "_start")) else sum(values)
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
    `timeout` to connect, `read_timeout` (default: `timeout`) for an answer. (The store routes
    its own calls; the denial statistics use this client.)"""
    nodes = [ClusterNode(host, port) for host, port in parse_cluster_url(url)]
    return RedisCluster(
        startup_nodes=nodes,
        socket_timeout=read_timeout or timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        max_connections=MAX_CONNECTIONS,
        require_full_coverage=False,
    )
