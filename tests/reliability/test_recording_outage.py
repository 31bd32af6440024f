"""Redis down while recording: the records of the outage are lost, the decisions never are.

The limiter decides on the in-process store here, so that what is tested is the recording
alone: its Redis (a real redis-server of the test's own) is killed mid-traffic and started
again, and every decision is answered as a limiter without any recording answers it."""

import pytest
import redis

from core import HierarchicalLimiter, ManualClock
from core.recorder import DecisionRecorder
from policies.telemetry import install_decision_recorder, reset_decision_recorder
from tests.api.conftest import clock, load, make_token, memory_engine, policy_doc, token_client  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db

KEYS = {"user": "u1", "team": "acme", "global": "*"}


@pytest.fixture
def recorded_on_redis(memory_engine, load, policy_doc, clock, disposable_redis):  # noqa: F811
    load(policy_doc)
    client = disposable_redis.client(socket_timeout=0.2, socket_connect_timeout=0.2)
    recorder = DecisionRecorder(client=client, clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    yield recorder
    reset_decision_recorder()


def expected_answers(policy_doc, n):  # noqa: F811
    """What the pro tier's limiter answers to n requests at one instant, nothing recorded."""
    tier = policy_doc["tiers"]["pro"]
    config = {level: [*tier.get(level, []), *(policy_doc["global"] if level == "global" else [])] for level in KEYS}
    limiter = HierarchicalLimiter.from_config(config, clock=ManualClock(0))
    return [limiter.acquire(KEYS).allowed for _ in range(n)]


def test_a_redis_outage_loses_records_never_decisions(recorded_on_redis, disposable_redis, policy_doc):  # noqa: F811
    client = token_client(make_token("decide"))
    answers = []

    def decide(n):
        for _ in range(n):
            response = client.post("/api/v1/decisions", {"keys": KEYS}, format="json")
            assert response.status_code == 200
            answers.append(response.json()["allowed"])

    decide(20)
    assert recorded_on_redis.flush() == 20

    disposable_redis.kill()
    decide(40)  # answered while the recording's Redis is gone
    assert recorded_on_redis.flush() == 0
    assert recorded_on_redis.lost == 40

    disposable_redis.start()  # empty: a killed Redis keeps nothing
    decide(5)
    assert recorded_on_redis.flush() == 5
    assert len(recorded_on_redis.records(0, 2**40)) == 5
    assert answers == expected_answers(policy_doc, 65)  # the bucket of 50 and its denials, exactly
    assert redis.Redis(port=disposable_redis.port).xlen("la:{records}") == 5
