"""`make run` on PostgreSQL: with DATABASE_URL=postgres://..., manage.py migrates and loads the
policies into that database, and gunicorn decides and edits policies from it."""

import psycopg
import pytest

from tests.serving import Service

pytestmark = pytest.mark.slow

POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}],
    "tiers": {"t": {"team": [{"type": "token_bucket", "capacity": 5, "per_second": 0}]}},
}
NEW_RULES = {"team": [{"type": "token_bucket", "capacity": 7, "per_second": 1}]}


@pytest.fixture
def database_url(postgres_server):
    """A database of its own on the session's PostgreSQL server, dropped afterwards."""
    with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE limiter_run")
        try:
            yield postgres_server.url("limiter_run")
        finally:
            admin.execute("DROP DATABASE limiter_run WITH (FORCE)")


def test_the_service_migrates_loads_decides_and_edits_on_the_postgresql_database_url_names(database_url):
    with Service(POLICY, extra_env={"DATABASE_URL": database_url}, scope="admin") as service:
        status, decision = service.post("/api/v1/decisions", {"keys": {"team": "acme"}})
        assert status == 200, decision
        assert decision["allowed"] and decision["remaining"] == 4

        status, tier = service.request("PATCH", "/api/v1/tiers/t", {"rules": NEW_RULES, "version": 1})
        assert status == 200, tier
        assert service.get("/api/v1/tiers/t") == (200, {"name": "t", "rules": NEW_RULES, "version": 2})
        status, ready = service.get("/readyz")
        assert status == 200, ready

    # Written to PostgreSQL, not to a SQLite file beside it.
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "SELECT tier.version, rule.params->>'capacity' FROM policies_tier tier"
            " JOIN policies_rule rule ON rule.tier_id = tier.id WHERE tier.name = 't'"
        ).fetchall()
    assert rows == [(2, "7")]
