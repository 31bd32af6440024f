"""A lease id names the engine's lease and the keys it was taken for, signed: it reads back,
and nothing else does (tampered, made up, truncated, foreign)."""

import pytest
from django.test import override_settings

from policies.services.leases import read_ticket, ticket

KEYS = {"user": "u1", "team": "acme é", "global": "*"}


def test_it_reads_back_the_keys_and_the_engine_lease():
    made = ticket(KEYS, "0123456789ab-1f")
    assert read_ticket(made) == (KEYS, "0123456789ab-1f")
    assert made.isascii() and "/" not in made and " " not in made


def test_no_lease_has_no_id():
    assert ticket(KEYS, None) is None


def test_a_changed_part_does_not_read():
    lease, packed, mac = ticket(KEYS, "0123456789ab-1f").split(".")
    other_keys = ticket({"user": "u2", "team": "acme é", "global": "*"}, lease).split(".")[1]
    assert read_ticket(f"{lease}.{other_keys}.{mac}") is None
    assert read_ticket(f"0123456789ab-20.{packed}.{mac}") is None
    assert read_ticket(f"{lease}.{packed}.{mac[:-1]}A") is None


@pytest.mark.parametrize("text", ["", "x", "a.b", "a.b.c.d", "..", "é.b.c", "a" * 5000, None, 3])
def test_anything_else_does_not_read(text):
    assert read_ticket(text) is None


def test_an_id_signed_with_another_secret_does_not_read():
    with override_settings(SECRET_KEY="another deployment's secret key, long enough to be one"):
        foreign = ticket(KEYS, "0123456789ab-1f")
    assert read_ticket(foreign) is None
