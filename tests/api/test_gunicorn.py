"""End to end: gunicorn with 4 workers sharing a real Redis; exactness across processes."""

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team", "fail_mode": "closed"}],
    "tiers": {"t": {"team": [{"type": "token_bucket", "capacity": 50, "per_second": 0}]}},
}


def test_200_concurrent_requests_at_a_team_of_50_admit_exactly_50(redis_url):
    from tests.serving import Service

    # A patient store: on a busy host (CI's two cores, 4 workers, 50 client threads) a reply
    # may take longer than the 50 ms default, and a degraded answer is not what this counts
    # (tests/reliability measures the timeouts).
    with Service(POLICY, redis_url=redis_url, workers=4, extra_env={"LIMITER_STORE_TIMEOUT": "1.0"}) as service:
        assert len(service.worker_pids()) == 4

        def one(i):
            return service.post("/api/v1/decisions", {"keys": {"user": f"u{i}", "team": "acme"}})

        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(one, range(200)))
    statuses = {status for status, _ in answers}
    assert statuses == {200}
    allowed = [body for _, body in answers if body["allowed"]]
    denied = [body for _, body in answers if not body["allowed"]]
    assert len(allowed) == 50
    assert len(denied) == 150
    assert all(body["degraded"] is False for _, body in answers)
    assert {body["blocked_by"] for body in denied} == {"team: token_bucket(50, 0/s)"}


SLOTS = 100
SLOT_POLICY = {
    "default_tier": "t",
    "levels": [{"name": "team", "fail_mode": "closed"}],
    "tiers": {"t": {"team": [{"type": "concurrency", "limit": SLOTS, "lease": 600}]}},
}


def test_workers_forked_from_one_parent_hand_out_leases_of_their_own(redis_url):
    """Issue 26: under `gunicorn --preload` both workers drew their lease ids from one parent's
    prefix and counter, so two requests in flight shared one slot and one release freed the
    other's. Each forked worker draws its own now."""
    from tests.serving import Service

    extra = {"GUNICORN_CMD_ARGS": "--preload", "LIMITER_STORE_TIMEOUT": "1.0"}
    taken = 40
    with Service(SLOT_POLICY, redis_url=redis_url, workers=2, extra_env=extra) as service:
        assert len(service.worker_pids()) == 2

        def one(_):
            return service.post("/api/v1/decisions", {"keys": {"team": "acme"}})

        # A connection each: gunicorn's two workers both take a share of them.
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(one, range(taken)))
        assert {status for status, _ in answers} == {200}
        tickets = [body["lease"] for _, body in answers]
        leases = [ticket.split(".")[0] for ticket in tickets]
        assert len(set(leases)) == taken, "two requests in flight were given one lease"
        assert len({lease.rsplit("-", 1)[0] for lease in leases}) == 2, "both workers answered, each its own prefix"

        def room() -> float:
            status, body = service.post("/api/v1/decisions", {"keys": {"team": "acme"}, "dry_run": True})
            assert status == 200
            return body["remaining"]

        assert room() == SLOTS - taken  # every request in flight holds a slot of its own
        status, body = service.post(f"/api/v1/leases/{tickets[0]}/release", None)
        assert status == 200 and body["released"] == 1
        assert room() == SLOTS - taken + 1  # one release frees one slot, not another's
