"""The what-if's replay in a process of its own: `python -m policies.replay_child`.

A replay is seconds of pure Python (core.replay). Run in a web worker it would hold that
worker's GIL and a thread the gateways need; here it holds neither, and it runs at the lowest
CPU priority (nice 19), so that the kernel serves the workers' decisions first. It imports no
Django: it takes a job (policies.policy.Policy objects, plain values, and the records or where
to read them) and gives back core.replay's Comparison.

The parent writes one pickled `Job` to standard input; the child writes frames to standard
output, each a 4-byte big-endian length and a pickle: `("progress", done, total)` now and
then, then `("done", comparison)`, `("unavailable", message)` when the stream cannot be read,
or `("failed", message)`. The parent (policies.services.jobs)
kills the child when the job's time is up.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from collections.abc import Sequence
from typing import Any, BinaryIO, NamedTuple

from core import StoreUnavailable
from core.recorder import Record, RedisLog
from core.replay import Comparison, compare

from .policy import Policy

# The largest stream a child reads: what LIMITER_RECORD_LIMIT keeps, and some.
READ_LIMIT = 10_000_000


class Job(NamedTuple):
    """What to replay: the two policies, the window and its step, and either the records or
    the Redis stream to read them from (`stream`: (url, key))."""

    current: Policy
    draft: Policy
    start: float
    end: float
    step: float
    tenant_level: str
    records: Sequence[Record] | None = None
    stream: tuple[str, str] | None = None


def run(job: Job, out: BinaryIO) -> Comparison:
    """The replay of `job`, telling `out` how far it has got."""
    records = job.records if job.records is not None else read_stream(*job.stream or ("", ""), job.start, job.end)

    def progress(done: int, total: int) -> None:
        write_frame(out, ("progress", done, total))

    return compare(records, job.current, job.draft, job.start, job.end, job.step, job.tenant_level, progress)


def read_stream(url: str, key: str, since: float, until: float) -> list[Record]:
    """The records of the window from the decision record's Redis stream (or cluster)."""
    if url.startswith("redis-cluster://"):
        from core.stores.cluster import connect_cluster  # only a cluster's deployment needs it

        client: Any = connect_cluster(url, timeout=5.0, read_timeout=30.0)
    else:
        import redis  # only a Redis deployment needs it

        client = redis.Redis.from_url(url, socket_timeout=30.0)
    return RedisLog(client, key, READ_LIMIT).read(since, until)


def write_frame(out: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


class FrameReader:
    """The frames of a stream read as its bytes arrive (the parent reads its child's pipe
    without blocking): `feed` takes what arrived and gives back the frames it completed."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= 4:
            (length,) = struct.unpack_from(">I", self.buffer)
            if len(self.buffer) < 4 + length:
                break
            frames.append(pickle.loads(bytes(self.buffer[4 : 4 + length])))
            del self.buffer[: 4 + length]
        return frames


def main() -> None:
    os.nice(19)  # the gateways' decisions come first
    out = sys.stdout.buffer
    try:
        job = pickle.load(sys.stdin.buffer)
        write_frame(out, ("done", run(job, out)))
    except StoreUnavailable as error:
        write_frame(out, ("unavailable", str(error)))
    except Exception as error:  # the parent tells the operator; a traceback helps no one there
        write_frame(out, ("failed", f"{type(error).__name__}: {error}"))


if __name__ == "__main__":
    main()
