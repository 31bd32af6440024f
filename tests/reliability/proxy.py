"""A TCP proxy on loopback that can slow a link down or cut it: what a congested or
partitioned network does to the service's Redis, on demand.

    with Proxy(upstream_port=redis.port) as proxy:       # 127.0.0.1:proxy.port -> redis
        proxy.delay(200)       # every chunk, each way, arrives 200 ms late (order kept)
        proxy.blackhole()      # connections stay open, every byte is swallowed: no answer ever
        proxy.drop()           # open connections are reset, new ones are reset on accept
        proxy.pass_through()   # back to a plain pipe

`Proxy` runs the proxy in a process of its own (`python -m tests.reliability.proxy`), told
what to do on its stdin, so that the test's load threads never hold it up for the GIL: a
delay is then the one asked for. `TcpProxy` is the proxy itself, an asyncio loop in a
thread. A mode applies to every connection, open or new, from the next chunk on; bytes
already scheduled under a delay still arrive.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from pathlib import Path

CHUNK = 65536


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TcpProxy:
    def __init__(self, upstream_port: int, port: int | None = None, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port or free_port()
        self.mode = "pass"  # pass | blackhole | drop
        self.latency = 0.0  # seconds added to every chunk in "pass" mode
        self.connections = 0  # accepted so far
        self._transports: set[asyncio.Transport] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # --- modes, from any thread -----------------------------------------------------------

    def pass_through(self) -> None:
        self.mode, self.latency = "pass", 0.0

    def delay(self, milliseconds: float) -> None:
        self.mode, self.latency = "pass", milliseconds / 1000

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def drop(self) -> None:
        self.mode = "drop"
        self._loop.call_soon_threadsafe(self._abort_all)

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        started.result(timeout=5)
        return self

    def stop(self) -> None:
        async def close():
            self._abort_all()
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # --- inside the loop ------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def _abort_all(self) -> None:
        for transport in list(self._transports):
            transport.abort()  # an RST, as a dead peer's kernel or a firewall would send
        self._transports.clear()

    async def _accept(self, client_reader, client_writer) -> None:
        self.connections += 1
        if self.mode == "drop":
            client_writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.transport.abort()
            return
        pair = (client_writer.transport, upstream_writer.transport)
        self._transports.update(pair)
        try:
            await asyncio.gather(self._pipe(client_reader, upstream_writer), self._pipe(upstream_reader, client_writer))
        finally:
            for transport in pair:
                transport.abort()
                self._transports.discard(transport)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one direction: each chunk is queued with the time it is due, and a second
        task writes them in order, so a delay never reorders bytes."""
        due: asyncio.Queue = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(due, writer))
        try:
            while True:
                try:
                    data = await reader.read(CHUNK)
                except (ConnectionError, OSError):
                    break
                if not data:
                    break
                if self.mode == "blackhole":
                    continue
                due.put_nowait((self._loop.time() + self.latency, data))
        finally:
            due.put_nowait(None)
            await sender

    async def _send(self, due: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while (item := await due.get()) is not None:
            at, data = item
            wait = at - self._loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.mode == "blackhole" or writer.transport.is_closing():
                continue
            writer.write(data)
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                return
        if not writer.transport.is_closing():
            writer.transport.abort()


class Proxy:
    """A TcpProxy in a child process, with the same modes."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Proxy:
        root = Path(__file__).resolve().parents[2]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.proxy", str(self.upstream_port), str(self.port)],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._expect("listening")
        return self

    def pass_through(self) -> None:
        self._tell("pass")

    def delay(self, milliseconds: float) -> None:
        self._tell(f"delay {milliseconds}")

    def blackhole(self) -> None:
        self._tell("blackhole")

    def drop(self) -> None:
        self._tell("drop")

    def connections(self) -> int:
        """How many connections the proxy has accepted so far."""
        return int(self._tell("connections"))

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process.stdin.close()
            self.process.stdout.close()
            self.process = None

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _tell(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._expect("ok")

    def _expect(self, word: str) -> str:
        # The child answers at once; a dead child gives an empty line, never a hang.
        line = self.process.stdout.readline().split()
        assert line and line[0] == word, f"the proxy said {line!r}, not {word!r}"
        return line[1] if len(line) > 1 else ""


def main(upstream_port: str, port: str) -> None:
    proxy = TcpProxy(int(upstream_port), int(port)).start()
    print("listening", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "pass":
            proxy.pass_through()
        elif command == "delay":
            proxy.delay(float(args[0]))
        elif command == "blackhole":
            proxy.blackhole()
        elif command == "drop":
            proxy.drop()
        elif command != "connections":
            print("unknown", command, flush=True)
            continue
        print("ok", proxy.connections, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
