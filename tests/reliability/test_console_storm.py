"""Nothing an operator or a stranger does in the console makes a gateway wait (issue 26): with
strangers storming the admin's login form (a fresh username each time) and operators storming
what-if replays over a large record, the gateways' decisions keep a p95 under 100 ms.

Before: twelve login clients against 2 workers of 4 threads took decisions from 8 ms at most
to a p50 of 782 ms; eight what-ifs at once made a decision wait 13.6 s.
"""

import pytest
import redis

from .load import Load, describe, percentile
from .storms import LoginStorm, WhatIfStorm, fill_record

pytestmark = pytest.mark.slow

POLICY = {
    "default_tier": "free",
    "levels": [{"name": "user"}, {"name": "team"}, {"name": "global"}],
    "tiers": {
        "free": {
            "user": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}],
            "team": [{"type": "token_bucket", "capacity": 10000, "per_second": 1000}],
        }
    },
    "global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}],
}
RECORDS = 100_000


def ask(i: int) -> tuple[str, dict]:
    return "/api/v1/decisions", {"keys": {"user": f"u{i % 300}", "team": f"t{i % 30}", "global": "*"}}


def test_decisions_stay_fast_while_the_login_form_and_the_what_if_are_stormed(redis_url):
    from tests.serving import Service

    extra = {"LIMITER_RECORD_LIMIT": str(RECORDS + 10_000), "LIMITER_STORE_TIMEOUT": "1.0"}
    with Service(POLICY, redis_url=redis_url, workers=2, threads=4, scope="admin", extra_env=extra) as service:
        fill_record(redis.Redis.from_url(redis_url), RECORDS)
        Load(service, ask, rate=50, duration=1, clients=4).run()  # warm: policy, token, plans
        with LoginStorm(service, clients=12) as logins, WhatIfStorm(service, clients=4) as whatifs:
            answers = Load(service, ask, rate=100, duration=10, clients=8).run()
    assert {a.status for a in answers} == {200}, describe(answers)
    took = [a.took for a in answers]
    assert percentile(took, 95) < 0.100, describe(answers)
    # The storms were real: logins were turned away (past the address's limit, or the worker's
    # bound on console requests), replays ran or were told to wait.
    assert logins.statuses[429] + logins.statuses[503] > 0, logins.statuses
    assert whatifs.statuses[200] + whatifs.statuses[503] > 0, whatifs.statuses
