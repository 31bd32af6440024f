"""The asyncio client of the REST API (core/async_client.py, imported from core.client).

As tests/api/test_client.py does for the synchronous client: the client talks to the real API,
served by pytest-django's live server in this process, whose policy cache runs on the same
manual clock that the client's `acquire` sleeps on, so waits are exact and no test sleeps for
real. Where a test must see the connections (how many, held answers, dropped ones) a plain
TCP proxy on loopback stands between the client and the server, passing bytes on unchanged.
"""

import asyncio
import socket
from urllib.parse import urlsplit

import pytest

from core.client import (
    AsyncLimiterClient,
    AsyncRemoteReservation,
    LimiterAPIError,
    LimiterUnavailable,
    RateLimited,
)
from core.decision import COST_EXCEEDS_LIMIT

from .conftest import make_token
from .test_client import GPU, KEYS, LIMITS

TEAM = {"team": "lab"}  # a bucket of 1000 that never refills: its room is what is held


class ManualSleep:
    """`acquire`'s sleep: moves the manual clock on and remembers each wait; `meanwhile`, if
    set, is awaited first (the loop runs other tasks while acquire waits)."""

    def __init__(self, clock):
        self.clock, self.waits, self.meanwhile = clock, [], None

    async def __call__(self, seconds):
        self.waits.append(round(seconds, 6))
        if self.meanwhile is not None:
            await self.meanwhile()
        self.clock.sleep(seconds)


class Proxy:
    """A TCP proxy on loopback in front of the live server: counts the connections it
    accepts, can hold the server's answers back (`hold()`, `let_go()`), and can close its
    clients' connections (`drop()`), as a server closing idle keep-alive connections does."""

    def __init__(self, upstream_url):
        url = urlsplit(upstream_url)
        self.upstream = (url.hostname, url.port)
        self.accepted = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.answer_held = asyncio.Event()
        self.writers = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.url = f"http://localhost:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.drop()
        self.server.close()

    async def serve(self, reader, writer):
        self.accepted += 1
        self.writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(self.pipe(reader, up_writer, False), self.pipe(up_reader, writer, True))

    async def pipe(self, source, sink, answers):
        try:
            while data := await source.read(65536):
                if answers and not self.gate.is_set():
                    self.answer_held.set()
                    await self.gate.wait()
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()

    def hold(self):
        self.gate.clear()
        self.answer_held.clear()

    def let_go(self):
        self.gate.set()

    def drop(self):
        for writer in self.writers:
            writer.close()
        self.writers = []


@pytest.fixture
def sleep(clock):
    return ManualSleep(clock)


@pytest.fixture
def run(live_server, memory_engine, load, clock, sleep):
    """Run `scenario(client)` in a fresh event loop, with a client of a decide-scope token
    that sleeps on the server's manual clock, closed at the end; its answer."""
    load(LIMITS)
    token = make_token("decide")

    def run(scenario, url=None, **options):
        async def main():
            async with AsyncLimiterClient(url or live_server.url, token, clock=clock, sleep=sleep, **options) as client:
                return await scenario(client)

        return asyncio.run(main())

    run.url, run.token = live_server.url, token
    return run


async def free_slots(client):
    """How many of the gpu's 2 concurrency slots are free: taken until denied, then released."""
    taken = []
    while len(taken) < 3 and (decision := await client.decide(GPU)).allowed:
        taken.append(decision)
    for decision in taken:
        await client.release(decision.lease)
    return len(taken)


async def team_room(client):
    """The team bucket's room (of 1000), found by dry runs: at most 1000, at least 0."""
    low, high = 0, 1000
    while low < high:  # the largest cost a dry run allows
        middle = (low + high + 1) // 2
        if (await client.decide(TEAM, middle, dry_run=True)).allowed:
            low = middle
        else:
            high = middle - 1
    return low


# Decisions ----------------------------------------------------------------------------------


def test_decisions_come_back_allowed_then_denied_with_the_wait_and_the_rule(run):
    async def scenario(client):
        return [await client.decide(KEYS) for _ in range(4)]

    decisions = run(scenario)
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions[:3]] == [2, 1, 0]
    denial = decisions[3]
    assert denial.retry_after == pytest.approx(1.0) and denial.blocked_by == "user: token_bucket(3, 1/s)"


def test_a_cost_that_can_never_fit_has_an_infinite_retry_after(run):
    async def scenario(client):
        return await client.decide(KEYS, cost=5)

    denial = run(scenario)
    assert not denial.allowed and denial.retry_after == float("inf") and denial.reason == COST_EXCEEDS_LIMIT


def test_a_batch_is_decided_in_order(run):
    async def scenario(client):
        twice = {"keys": KEYS, "cost": 2}
        return await client.decide_batch([twice, twice, {"keys": {"user": "u2"}}])

    decisions = run(scenario)
    assert [d.allowed for d in decisions] == [True, False, True]
    assert decisions[1].retry_after == pytest.approx(1.0)


def test_acquire_awaits_the_servers_retry_after_while_the_loop_serves_other_tasks(run, clock, sleep):
    """Five acquires on a bucket of 3 at 1/s go at 0, 0, 0, 1 and 2 s; during each wait
    another task's decision goes through on the same client, which a wait that blocked the
    loop would never let happen (the test would time out instead)."""
    others = []

    async def scenario(client):
        async def another_decision():
            others.append((await client.decide({"user": f"other-{len(others)}"})).allowed)

        sleep.meanwhile = lambda: asyncio.wait_for(asyncio.create_task(another_decision()), 5)
        start, sent_at = clock(), []
        for _ in range(5):
            assert (await client.acquire(KEYS, timeout=10.0)).allowed
            sent_at.append(round(clock() - start, 6))
        return sent_at

    assert run(scenario) == [0, 0, 0, 1, 2]
    assert sleep.waits == [1.0, 1.0]
    assert others == [True, True]


def test_acquire_gives_up_with_the_denial_when_the_wait_outlasts_the_timeout(run, clock, sleep):
    async def scenario(client):
        assert (await client.acquire(KEYS, cost=3)).allowed
        start = clock()
        denial = await client.acquire(KEYS, cost=3, timeout=2.5)  # needs 3 s
        return denial, clock() - start, await client.acquire(KEYS, cost=50, timeout=60.0)

    denial, waited, never = run(scenario)
    assert not denial.allowed and denial.retry_after == pytest.approx(3.0) and waited == 0
    assert not never.allowed and never.reason == COST_EXCEEDS_LIMIT
    assert sleep.waits == []


# Reservations -------------------------------------------------------------------------------


def test_a_reservation_commits_its_actual_cost_on_leaving_the_block(run):
    async def scenario(client):
        async with client.reserve(TEAM, cost=80) as reservation:
            assert isinstance(reservation, AsyncRemoteReservation) and reservation.allowed and reservation.id
            held = await team_room(client)
            reservation.actual_cost = 30
        return reservation, held, await team_room(client)

    reservation, held, after = run(scenario)
    assert reservation.settled and reservation.settlement["status"] == "committed"
    assert reservation.settlement["refunded"] == 50
    assert (held, after) == (920, 970)


def test_an_awaited_reservation_is_settled_by_hand_as_a_gateways_hooks_would(run):
    async def scenario(client):
        reservation = await client.reserve(TEAM, cost=100)  # before the call...
        held = await team_room(client)
        await reservation.commit(140)  # ...and after it, with the real usage
        return reservation, held, await team_room(client)

    reservation, held, after = run(scenario)
    assert reservation.settlement["charged"] == 40 and (held, after) == (900, 860)


def test_an_exception_in_the_block_cancels_the_reservation_and_goes_on(run):
    async def scenario(client):
        with pytest.raises(ZeroDivisionError):
            async with client.reserve(TEAM, cost=400) as reservation:
                raise ZeroDivisionError
        return reservation, await team_room(client)

    reservation, after = run(scenario)
    assert reservation.settlement["status"] == "cancelled" and reservation.settlement["refunded"] == 400
    assert after == 1000


def test_a_task_cancelled_mid_reservation_leaves_nothing_held(run):
    """A client that goes away cancels its task: CancelledError, which is no Exception,
    reaches the block, which cancels the reservation, estimate and slot, before it goes on."""

    async def scenario(client):
        inside = asyncio.Event()
        reservations = []

        async def call_the_model():
            async with client.reserve({**TEAM, **GPU}, cost=400) as reservation:
                reservations.append(reservation)
                inside.set()
                await asyncio.Event().wait()  # a model that never answers

        task = asyncio.create_task(call_the_model())
        await inside.wait()
        held = await team_room(client), await free_slots(client)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return reservations[0], held, (await team_room(client), await free_slots(client))

    reservation, held, after = run(scenario)
    assert held == (600, 1)
    assert reservation.settlement["status"] == "cancelled"
    assert after == (1000, 2)


def test_a_task_cancelled_while_its_reservation_is_made_leaves_nothing_held(run):
    """Cancelled after the server made the reservation but before its answer came back: the
    client cancels it as soon as the answer arrives, and aclose() waits for that."""

    async def scenario(client):
        async with Proxy(run.url) as proxy:
            async with AsyncLimiterClient(proxy.url, run.token) as proxied:
                await proxied.decide({"user": "warm"})  # a connection, kept alive
                proxy.hold()
                task = asyncio.create_task(proxied.reserve(TEAM, cost=400).make())
                await proxy.answer_held.wait()  # the server has answered: it holds 400 now
                held = await team_room(client)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                proxy.let_go()
        return held, await team_room(client)

    assert run(scenario) == (600, 1000)


def test_a_denied_reservation_raises_rate_limited_and_the_block_never_runs(run):
    async def scenario(client):
        first, second = await client.reserve(GPU), await client.reserve(GPU)  # both slots
        ran = []
        with pytest.raises(RateLimited) as raised:
            async with client.reserve(GPU):
                ran.append(True)
        await first.cancel()
        await second.cancel()
        return ran, raised.value.decision

    ran, decision = run(scenario)
    assert ran == [] and not decision.allowed and decision.blocked_by.startswith("gpu: concurrency(2")


def test_settling_twice_is_a_409_and_a_reserve_is_used_once(run):
    async def scenario(client):
        request = client.reserve(TEAM, cost=5)
        reservation = await request
        await reservation.commit()
        with pytest.raises(LimiterAPIError) as twice:
            await reservation.commit()
        with pytest.raises(RuntimeError, match="used once"):
            await request
        return twice.value

    error = run(scenario)
    assert (error.status, error.code) == (409, "conflict")


# Slots and their release --------------------------------------------------------------------


def test_release_frees_a_slot_once(run):
    async def scenario(client):
        first, second = await client.decide(GPU), await client.decide(GPU)
        full = await client.decide(GPU)
        released = [await client.release(first.lease), await client.release(first.lease), await client.release(None)]
        again = await client.decide(GPU)
        await client.release(second.lease)
        await client.release(again.lease)
        return first, full, released, again

    first, full, released, again = run(scenario)
    assert first.lease and not full.allowed
    assert released == [True, False, False]
    assert again.allowed


def test_a_slot_is_released_when_its_block_fails(run):
    async def scenario(client):
        with pytest.raises(KeyError):
            async with client.slot(GPU) as decision:
                assert decision.lease
                raise KeyError
        return await free_slots(client)

    assert run(scenario) == 2


def test_a_slot_held_by_a_cancelled_task_is_released(run):
    async def scenario(client):
        inside = asyncio.Event()

        async def hold_a_slot():
            async with client.slot(GPU):
                inside.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(hold_a_slot())
        await inside.wait()
        held = await free_slots(client)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return held, await free_slots(client)

    assert run(scenario) == (1, 2)


# Errors -------------------------------------------------------------------------------------


def test_a_server_that_is_not_there_is_limiter_unavailable(run):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the client tries it

    async def scenario(client):
        with pytest.raises(LimiterUnavailable, match="cannot connect"):
            await client.decide(KEYS)

    run(scenario, url=f"http://127.0.0.1:{port}")


def test_a_server_that_never_answers_is_limiter_unavailable_after_the_timeout(run):
    async def scenario(client):
        async def listen_only(reader, writer):
            await reader.read(65536)
            await asyncio.Event().wait()

        server = await asyncio.start_server(listen_only, "127.0.0.1", 0)
        silent = AsyncLimiterClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "t", timeout=0.2)
        with pytest.raises(LimiterUnavailable, match="no answer within 0.2 s"):
            await silent.decide(KEYS)
        server.close()

    run(scenario)


def test_a_bad_request_is_an_api_error_naming_the_field(run):
    async def scenario(client):
        errors = []
        for keys, cost in ((KEYS, -1), ({"planet": "mars"}, 1)):
            with pytest.raises(LimiterAPIError) as raised:
                await client.decide(keys, cost)
            errors.append(raised.value)
        return errors

    negative, unknown = run(scenario)
    assert (negative.status, negative.code) == (400, "invalid") and "cost" in negative.fields
    assert "keys.planet" in unknown.fields


def test_a_bad_token_is_a_401(run):
    async def scenario(client):
        async with AsyncLimiterClient(run.url, "la_not-a-token") as stranger:
            with pytest.raises(LimiterAPIError) as raised:
                await stranger.decide(KEYS)
        return raised.value

    error = run(scenario)
    assert (error.status, error.code) == (401, "authentication_failed")


def test_bad_arguments_are_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="http:// or https://"):
        AsyncLimiterClient("ftp://example.com", "t")
    with pytest.raises(ValueError, match="max_connections"):
        AsyncLimiterClient("http://127.0.0.1:1", "t", max_connections=0)


def test_a_client_belongs_to_the_loop_it_was_first_used_on(run):
    client = AsyncLimiterClient(run.url, run.token)

    async def decide():
        decision = await client.decide({"user": "loops"})
        await client.aclose()
        return decision

    assert asyncio.run(decide()).allowed
    with pytest.raises(RuntimeError, match="one client per loop"):
        asyncio.run(decide())


# Connections --------------------------------------------------------------------------------


def test_many_concurrent_decisions_share_a_few_kept_alive_connections(run):
    async def scenario(client):
        async with Proxy(run.url) as proxy:
            # A request's timeout counts its wait for a connection: 100 on 4 take a while here.
            async with AsyncLimiterClient(proxy.url, run.token, max_connections=4, timeout=60) as shared:
                first = await asyncio.gather(*(shared.decide({"user": f"many-{i}"}) for i in range(100)))
                opened = proxy.accepted
                second = await asyncio.gather(*(shared.decide({"user": f"many-{i}"}) for i in range(100)))
                return first + second, opened, proxy.accepted, shared.connections_opened

    decisions, opened, accepted, counted = run(scenario)
    assert len(decisions) == 200 and all(d.allowed for d in decisions)
    assert [d.remaining for d in decisions[100:]] == [1] * 100  # each decided once
    assert 1 <= opened <= 4 and accepted == opened == counted


def test_a_kept_alive_connection_the_server_closed_is_replaced_and_the_request_decided_once(run):
    async def scenario(client):
        async with Proxy(run.url) as proxy:
            async with AsyncLimiterClient(proxy.url, run.token) as proxied:
                await proxied.decide({"user": "idle"})
                # As a server does with a connection idle past its keep-alive: the client finds
                # it closed before sending, or on reading, and sends once more on a new one.
                proxy.drop()
                decision = await proxied.decide({"user": "idle"})
                return decision, proxy.accepted

    decision, accepted = run(scenario)
    assert decision.allowed and decision.remaining == 1 and accepted == 2
