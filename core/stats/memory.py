"""The statistics' own in-process store: the few Redis commands `core.stats` uses, on dicts.

Statistics run one code path, whether they are shared through Redis or kept in one
process: the same pipelines of HINCRBY, ZINCRBY, EXPIRE and so on go to a redis-py client or
to this. Values keep their Python type (Redis would hand back bytes); the statistics read
both. Keys expire on the statistics' clock, like Redis keys on the server's.
"""

from __future__ import annotations

import heapq
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class MemoryStatsStore:
    """Hashes and sorted sets with expiry, thread-safe; the subset of redis-py the
    statistics call (`pipeline()`, and each command on the pipeline)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._data: dict[str, dict[str, Any]] = {}
        self._deadlines: dict[str, float] = {}
        self._expiries: list[tuple[float, str]] = []  # a heap; stale entries are skipped
        self._lock = threading.Lock()

    def pipeline(self, transaction: bool = True) -> MemoryPipeline:
        return MemoryPipeline(self)

    def run(self, commands: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Run queued commands in order, at once for every other thread (as MULTI/EXEC)."""
        with self._lock:
            self._forget_expired()
            return [getattr(self, "_" + name)(*args) for name, args in commands]

    def zscan_iter(self, name: str, match: str = "*", count: int | None = None) -> Iterator[tuple[str, float]]:
        """The members matching a glob `match`, with their scores (Redis's ZSCAN ... MATCH)."""
        with self._lock:
            self._forget_expired()
            matches = _glob(match).fullmatch
            found = [(m, s) for m, s in self._ranked(name) if matches(m)]
        return iter(found)

    def keys(self) -> list[str]:
        """Every live key (for tests and the memory bound's checks)."""
        with self._lock:
            self._forget_expired()
            return sorted(self._data)

    def _forget_expired(self) -> None:
        now = self.clock()
        while self._expiries and self._expiries[0][0] <= now:
            deadline, name = heapq.heappop(self._expiries)
            if self._deadlines.get(name) == deadline:
                del self._deadlines[name], self._data[name]

    # --- commands (called locked, through run()) -----------------------------------------

    def _hincrby(self, name: str, field: str, n: int) -> int:
        return self._add(name, field, n)

    def _hincrbyfloat(self, name: str, field: str, n: float) -> float:
        hash_ = self._data.setdefault(name, {})
        hash_[field] = float(hash_.get(field, 0)) + n
        return hash_[field]

    def _hset(self, name: str, field: str, value: Any) -> int:
        self._data.setdefault(name, {})[field] = value
        return 1

    def _hget(self, name: str, field: str) -> Any:
        return self._data.get(name, {}).get(field)

    def _hsetnx(self, name: str, field: str, value: Any) -> int:
        hash_ = self._data.setdefault(name, {})
        if field in hash_:
            return 0
        hash_[field] = value
        return 1

    def _incr(self, name: str) -> int:
        # A counter kept as a one-field hash: no other command reads it.
        return self._hincrby(name, "", 1)

    def _hgetall(self, name: str) -> dict[str, Any]:
        return dict(self._data.get(name, {}))

    def _zincrby(self, name: str, n: float, member: str) -> float:
        return self._add(name, member, n)

    def _zadd(self, name: str, mapping: Mapping[str, float]) -> int:
        zset = self._data.setdefault(name, {})
        added = sum(1 for member in mapping if member not in zset)
        zset.update(mapping)
        return added

    def _zrem(self, name: str, *members: str) -> int:
        zset = self._data.get(name, {})
        removed = sum(1 for member in members if zset.pop(member, None) is not None)
        self._drop_if_empty(name)
        return removed

    def _zremrangebyrank(self, name: str, start: int, end: int) -> int:
        doomed = self._by_rank(name, start, end)
        for member, _ in doomed:
            del self._data[name][member]
        self._drop_if_empty(name)
        return len(doomed)

    def _zrange(self, name: str, start: int, end: int, withscores: bool = False) -> list[Any]:
        chosen = self._by_rank(name, start, end)
        return chosen if withscores else [member for member, _ in chosen]

    def _zrangebyscore(self, name: str, low: float, high: float, start: int = 0, num: int = -1) -> list[str]:
        within = self._by_score(name, low, high)
        return within[start:] if num < 0 else within[start : start + num]

    def _zremrangebyscore(self, name: str, low: float, high: float) -> int:
        return self._zrem(name, *self._by_score(name, low, high))

    def _expire(self, name: str, seconds: float) -> bool:
        if name not in self._data:
            return False
        deadline = self.clock() + seconds
        self._deadlines[name] = deadline
        heapq.heappush(self._expiries, (deadline, name))
        return True

    def _add(self, name: str, field: str, n: float) -> Any:
        """Add `n` to a hash's field or a sorted set's score (0 when absent)."""
        values = self._data.setdefault(name, {})
        values[field] = values.get(field, 0) + n
        return values[field]

    def _by_rank(self, name: str, start: int, end: int) -> list[tuple[str, float]]:
        """Members from rank `start` to `end` inclusive; negative ranks count from the highest."""
        return self._ranked(name)[start : (end + 1) or None]

    def _by_score(self, name: str, low: float, high: float) -> list[str]:
        low, high = float(low), float(high)
        return [member for member, score in self._ranked(name) if low <= score <= high]

    def _ranked(self, name: str) -> list[tuple[str, float]]:
        """Members lowest score first, ties by member: Redis's rank order."""
        return sorted(self._data.get(name, {}).items(), key=lambda item: (item[1], item[0]))

    def _drop_if_empty(self, name: str) -> None:
        if name in self._data and not self._data[name]:
            del self._data[name]
            self._deadlines.pop(name, None)


class MemoryPipeline:
    """Commands queued and run together, as a redis-py pipeline."""

    def __init__(self, store: MemoryStatsStore) -> None:
        self._store = store
        self._commands: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., MemoryPipeline]:
        if not hasattr(MemoryStatsStore, "_" + name):
            raise AttributeError(name)

        def queue(*args: Any, **options: Any) -> MemoryPipeline:
            self._commands.append((name, args + tuple(options.values())))
            return self

        return queue

    def execute(self) -> list[Any]:
        commands, self._commands = self._commands, []
        return self._store.run(commands)


def _glob(pattern: str) -> re.Pattern[str]:
    """Redis's glob (`*`, `?`, `\\x` for a literal x) as a regular expression."""
    parts, chars = [], iter(pattern)
    for c in chars:
        if c == "\\":
            parts.append(re.escape(next(chars, "\\")))
        elif c == "*":
            parts.append(".*")
        elif c == "?":
            parts.append(".")
        else:
            parts.append(re.escape(c))
    return re.compile("".join(parts), re.S)
