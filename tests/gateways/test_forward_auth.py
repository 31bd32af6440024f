"""Real nginx and Caddy, configured as docs/GATEWAYS.md says, in front of a small upstream,
asking the real service's forward-auth endpoint (gunicorn, as `make run` serves it) about
each request: a stock gateway enforces a team limit exactly, on the team and user it knows
the caller by (its API key), whatever X-Limiter-* header fields the client sends."""

import copy
import json
import uuid

import pytest

from tests.gateways.running import Caddy, Caller, Nginx, Upstream, team_remaining
from tests.policies.conftest import POLICY
from tests.serving import Service, free_port

N = 5
GATEWAYS = {"nginx": Nginx, "caddy": Caddy}

# What a client may add to its request in the hope of paying less, or of making another team
# pay (`victim`); the `i`th request of a run. Each set is sent on top of the caller's own
# X-Limiter-Team and X-Limiter-User, as the recipes before issue 26 had clients send them.
FORGERIES = {
    "team": lambda victim, i: {"X-Limiter-Team": victim.team, "X-Limiter-User": victim.user},
    "user": lambda victim, i: {"X-Limiter-User": f"forged-{i}"},
    "cost": lambda victim, i: {"X-Limiter-Cost": "1e-9"},
    "priority": lambda victim, i: {"X-Limiter-Priority": "vip"},
    "underscores": lambda victim, i: {
        "X_Limiter_Team": victim.team,
        "X_Limiter_User": f"forged-{i}",
        "X_Limiter_Cost": "1e-9",
    },
    "all, in lower case": lambda victim, i: {
        "x-limiter-team": victim.team,
        "x-limiter-user": f"forged-{i}",
        "x-limiter-cost": "1e-9",
        "x-limiter-priority": "batch",
    },
}
ROLES = ("caller", "victim")
FREE_TIER_LABELS = ("exact", "denial", "lease", "attacker", "target")


def policy() -> dict:
    doc = copy.deepcopy(POLICY)
    # The free tier's team: N requests in an hour; its users' own limit (10/s) stays out of reach.
    doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": N, "window": 3600}]
    doc["tiers"]["slots"] = {"team": [{"type": "concurrency", "limit": 1, "lease": 60}]}
    # Where forging a user would pay: a user may make N requests an hour, its team 2N.
    doc["tiers"]["forgery"] = {
        "user": [{"type": "fixed_window", "limit": N, "window": 3600}],
        "team": [{"type": "fixed_window", "limit": 2 * N, "window": 3600}],
    }
    doc["tenants"].update({f"slotted-{name}": {"tier": "slots"} for name in GATEWAYS})
    doc["tenants"].update(
        {
            forging_team(name, forgery, role): {"tier": "forgery"}
            for name in GATEWAYS
            for forgery in FORGERIES
            for role in ROLES
        }
    )
    return doc


def forging_team(gateway: str, forgery: str, role: str) -> str:
    return f"{gateway}-{forgery.replace(' ', '-').replace(',', '')}-{role}"


def callers(gateway: str) -> dict[str, Caller]:
    """Everyone a gateway knows, by label: the forging tests' teams (tier `forgery`), the
    slotted team, and a team of the free tier with a fresh window for each other label."""

    def caller(team: str) -> Caller:
        return Caller(f"key-{uuid.uuid4().hex}", team, f"user-{uuid.uuid4().hex[:12]}")

    known = {label: caller(f"team-{uuid.uuid4().hex[:12]}") for label in FREE_TIER_LABELS}
    known["slotted"] = caller(f"slotted-{gateway}")
    for forgery in FORGERIES:
        known.update({f"{forgery} {role}": caller(forging_team(gateway, forgery, role)) for role in ROLES})
    return known


def honest(caller: Caller) -> dict:
    """What a client of the recipes before issue 26 sent, its API key added for today's: the
    same requests run against both."""
    return {"X-Api-Key": caller.key, "X-Limiter-Team": caller.team, "X-Limiter-User": caller.user}


def forged(caller: Caller, forgery: dict) -> dict:
    """The caller's own header fields, those that `forgery` names (in any case) replaced."""
    names = {name.lower() for name in forgery}
    return {**{k: v for k, v in honest(caller).items() if k.lower() not in names}, **forgery}


@pytest.fixture(scope="module")
def limiter():
    with Service(policy()) as service:
        yield service


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as upstream:
        yield upstream


@pytest.fixture(scope="module", params=list(GATEWAYS))
def gateway(request, limiter, upstream):
    with GATEWAYS[request.param](limiter.port, upstream.port, limiter.token, callers(request.param)) as gateway:
        yield gateway


def key_of(caller: Caller) -> dict:
    """What a client of the documented recipes sends: its API key, nothing of the limiter's."""
    return {"X-Api-Key": caller.key}


def test_a_team_limit_of_n_lets_exactly_n_of_3n_requests_through(gateway, upstream):
    caller, path = gateway.callers["exact"], f"/{uuid.uuid4().hex}"
    answers = [gateway.get(path, key_of(caller)) for _ in range(3 * N)]
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * N + [429] * (2 * N)
    assert upstream.hits.get(path, 0) == N
    for status, headers, _ in answers:
        assert headers["ratelimit-policy"].startswith('"user:token_bucket";q=10;w=10, "team:fixed_window";q=5;w=3600')
        assert headers["ratelimit"].startswith('"')
        if status == 429:
            assert 1 <= int(headers["retry-after"]) <= 3600
    assert [headers["ratelimit"].split(";r=")[1] for _, headers, _ in answers[:N]] == ["4", "3", "2", "1", "0"]


def test_a_denial_carries_the_retry_after_the_limiter_gave(gateway, limiter):
    caller = gateway.callers["denial"]
    for _ in range(N):
        gateway.get("/", key_of(caller))
    status, headers, body = gateway.get("/", key_of(caller))
    keys = {"user": caller.user, "team": caller.team, "global": "*"}
    asked = limiter.post("/api/v1/decisions", {"keys": keys, "dry_run": True})
    assert status == 429
    assert abs(int(headers["retry-after"]) - asked[1]["retry_after"]) <= 1
    assert f'"team:fixed_window";r=0;t={headers["retry-after"]}' == headers["ratelimit"]
    # A body the client can read: nginx's own in the error shape, Caddy's the limiter's decision.
    denial = json.loads(body)
    assert denial["error"]["code"] == "rate_limited" if gateway.name == "nginx" else denial["allowed"] is False


def test_an_upstream_that_never_releases_cannot_lock_a_team_out(gateway, limiter, upstream):
    """A team of concurrency limit 1 behind nginx or Caddy, whose upstream (ours) gives nothing
    back: forward-auth takes no slot unless the gateway asks, so every request goes through,
    with an empty lease, also when the client itself asks for a slot (the gateway drops it)."""
    caller = gateway.callers["slotted"]
    answers = [gateway.get("/slots", {**key_of(caller), "X-Limiter-Slot": "1"}) for _ in range(3)]
    assert [status for status, _, _ in answers] == [200] * 3
    assert [json.loads(body).get("x-limiter-lease", "") for _, _, body in answers] == [""] * 3
    assert team_remaining(limiter, caller.team) == 1  # the slot is free


def test_without_a_slot_the_upstream_gets_an_empty_lease_not_the_clients(gateway):
    status, _, body = gateway.get("/", {**key_of(gateway.callers["lease"]), "X-Limiter-Lease": "forged"})
    assert status == 200 and json.loads(body).get("x-limiter-lease", "") == ""


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-Api-Key": "key-nobody-knows"}, {"X-Limiter-Team": "team-of-a-guess", "X-Limiter-User": "u1"}],
    ids=["no key", "an unknown key", "the limiter's fields alone"],
)
def test_a_request_without_a_known_api_key_is_the_gateways_own_401(gateway, upstream, headers):
    path = f"/{uuid.uuid4().hex}"
    status, answer, body = gateway.get(path, headers)
    assert (status, upstream.hits.get(path, 0)) == (401, 0)
    assert answer["content-type"] == "application/json" and answer["www-authenticate"] == 'ApiKey header="X-Api-Key"'
    assert json.loads(body)["error"] == {
        "code": "authentication_failed",
        "message": "a known API key is required in X-Api-Key",
        "fields": {},
    }


@pytest.mark.parametrize("name", list(GATEWAYS))
def test_without_the_limiter_nothing_reaches_the_upstream(name, upstream):
    """A limiter that does not answer: nginx's 500, with a JSON body; Caddy's 502."""
    caller = Caller("key-of-someone", "team-x", "user-x")
    path = f"/{uuid.uuid4().hex}"
    with GATEWAYS[name](free_port(), upstream.port, "la_none", {"someone": caller}) as gateway:
        status, _, body = gateway.get(path, key_of(caller))
    assert upstream.hits.get(path, 0) == 0
    if name == "nginx":
        assert status == 500 and json.loads(body)["error"]["code"] == "limiter_failed"
    else:
        assert status == 502


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_clients_own_limiter_header_fields_change_nothing(gateway, limiter, upstream, forgery):
    """With a user limit of N and a team limit of 2N, 3N requests that carry forged X-Limiter-*
    fields let exactly N through, counted against the caller's own user and team at cost 1;
    the team they name is untouched, and the upstream sees the gateway's caller."""
    caller, victim = gateway.callers[f"{forgery} caller"], gateway.callers[f"{forgery} victim"]
    path = f"/{uuid.uuid4().hex}"
    answers = [gateway.get(path, forged(caller, FORGERIES[forgery](victim, i))) for i in range(3 * N)]
    outcome = {
        "statuses": [status for status, _, _ in answers],
        "through": upstream.hits.get(path, 0),
        "caller's team left": team_remaining(limiter, caller.team),
        "victim's team left": team_remaining(limiter, victim.team),
    }
    assert outcome == {
        "statuses": [200] * N + [429] * (2 * N),
        "through": N,
        "caller's team left": N,
        "victim's team left": 2 * N,
    }
    seen = json.loads(answers[0][2])
    assert (seen["x-limiter-team"], seen["x-limiter-user"]) == (caller.team, caller.user)
    assert seen["x-limiter-cost"] == "1" and "x-limiter-priority" not in seen


def test_outside_requests_naming_another_team_cannot_empty_its_window(gateway):
    """The finding of issue 26: requests naming another team, at a cost of that team's whole
    window, emptied it. Now they are the attacker's own, at cost 1."""
    attacker, target = gateway.callers["attacker"], gateway.callers["target"]
    forgery = {"X-Limiter-Team": target.team, "X-Limiter-User": target.user, "X-Limiter-Cost": str(N)}
    attacks = [gateway.get("/", forged(attacker, forgery))[0] for _ in range(2 * N)]
    targets = [gateway.get("/", honest(target))[0] for _ in range(N)]
    assert {"attacks": attacks, "target's own": targets} == {
        "attacks": [200] * N + [429] * N,
        "target's own": [200] * N,
    }
