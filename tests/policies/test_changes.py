"""What a change of the policy did, in the operators' words (policies/changes.py): rules
diffed between two versions of a tier or tenant, a row's own fields by name, and sentences."""

import pytest

from policies.changes import Change, Names, previous_records, record_changes, rule_changes, rule_name, sentence
from policies.history import replace_rules
from policies.models import Level, Rule, Tenant, Tier

pytestmark = pytest.mark.django_db

LEVELS = {1: "user", 2: "team"}


def row(level=1, type="token_bucket", position=0, label="", shadow=False, counts="cost", **params):
    return {"level": level, "position": position, "type": type, "params": params, "label": label, "shadow": shadow,
            "counts": counts}  # fmt: skip


def words(changes):
    return [str(change) for change in changes]


def test_a_rule_changed_in_place_says_which_parameter_moved():
    old = [row(capacity=100, per_second=10)]
    new = [row(capacity=200, per_second=10)]
    assert words(rule_changes(old, new, LEVELS)) == ["user: token_bucket capacity 100 → 200"]


def test_a_rule_kept_as_it_was_is_no_change_whatever_else_moved():
    kept = row(level=2, capacity=1000, per_second=100)
    assert rule_changes([kept, row(capacity=1, per_second=1)], [kept, row(capacity=2, per_second=1)], LEVELS) == [
        Change("user: token_bucket capacity", "1", "2")
    ]


def test_rules_of_another_type_are_removed_and_added_with_their_names():
    old = [row(type="sliding_window", limit=600, window=60, label="RPM_LIMIT")]
    new = [row(type="gcra", rate=50, burst=200)]
    assert words(rule_changes(old, new, LEVELS)) == [
        "user: removed sliding_window(600/60s) [RPM_LIMIT]",
        "user: added gcra(50/s, burst 200)",
    ]


def test_a_rules_own_fields_are_diffed_too():
    old = [row(capacity=5, per_second=1, label="BURST")]
    new = [row(capacity=5, per_second=1, shadow=True, counts="requests")]
    assert words(rule_changes(old, new, LEVELS)) == [
        "user: token_bucket label BURST → none",
        "user: token_bucket shadow off → on",
        "user: token_bucket counts cost → requests",
    ]


def test_two_rules_of_one_type_at_a_level_are_told_apart_by_their_label():
    old = [row(capacity=5, per_second=1, label="A"), row(position=1, capacity=9, per_second=1, label="B")]
    new = [row(capacity=6, per_second=1, label="A"), row(position=1, capacity=9, per_second=1, label="B")]
    assert words(rule_changes(old, new, LEVELS)) == ["user: token_bucket [A] capacity 5 → 6"]


def test_rules_that_only_swap_places_say_so():
    a, b = row(capacity=5, per_second=1), row(type="gcra", rate=1, burst=2)
    assert words(rule_changes([a, b], [b, a], LEVELS)) == [
        "user: order token_bucket(5, 1/s), gcra(1/s, burst 2) → gcra(1/s, burst 2), token_bucket(5, 1/s)"
    ]


def test_a_level_deleted_since_is_named_by_its_id():
    assert words(rule_changes([], [row(level=9, capacity=1, per_second=1)], LEVELS)) == [
        "level #9 (deleted): added token_bucket(1, 1/s)"
    ]


def test_a_version_before_rules_were_kept_says_so_rather_than_inventing_a_diff():
    [note] = rule_changes(None, [row(capacity=1, per_second=1)], LEVELS)
    assert note.kind == "note" and "not kept with the version before" in str(note)


def test_a_tenants_record_diffs_its_tier_by_name_and_its_overrides(load, policy):
    load(policy)
    bigco = Tenant.objects.get(key="bigco")
    bigco.tier = Tier.objects.get(name="free")
    bigco.save()
    replace_rules(bigco, {"team": [{"type": "token_bucket", "capacity": 700, "per_second": 10}]})

    latest, before = bigco.history.all()[:2]
    assert words(record_changes(latest, before)) == ["tier pro → free", "team: token_bucket capacity 600 → 700"]


def test_a_tiers_first_record_lists_its_rules_as_added(load, policy):
    load(policy)
    first = Tier.objects.get(name="free").history.earliest()
    assert words(record_changes(first, None)) == [
        "user: added token_bucket(10, 1/s)",
        "team: added token_bucket(100, 10/s)",
    ]


def test_a_rules_own_record_diffs_its_parameters_one_by_one(load, policy):
    load(policy)
    rule = Rule.objects.get(tier__name="free", level__name="team")
    rule.params = {"capacity": 150, "per_second": 10}
    rule.level = Level.objects.get(name="user")
    rule.save()
    latest, before = rule.history.all()[:2]
    assert words(record_changes(latest, before)) == ["level team → user", "capacity 100 → 150"]


def test_the_records_before_a_page_of_records_take_two_queries(load, policy, django_assert_num_queries):
    load(policy)
    for capacity in (11, 12, 13):
        free = Tier.objects.get(name="free")
        free.save()
        replace_rules(free, {"user": [{"type": "token_bucket", "capacity": capacity, "per_second": 1}]})
    records = list(Tier.objects.get(name="free").history.all())  # newest first
    with django_assert_num_queries(2):
        previous = previous_records(records)
    assert [previous.get(r.history_id) for r in records] == [*records[1:], None]


def test_a_sentence_spells_out_a_few_changes_and_counts_the_rest(load, policy):
    load(policy)
    pro = Tier.objects.get(name="pro")
    pro.name = "professional"
    pro.save()
    replace_rules(pro, {"user": [{"type": "token_bucket", "capacity": 1, "per_second": 1}]})
    latest, before = pro.history.all()[:2]
    names = Names()
    text = sentence(latest, record_changes(latest, before, names), names)
    assert text == (
        "changed tier professional: name pro → professional; user: token_bucket capacity 50 → 1; "
        "user: token_bucket per_second 10 → 1; and 3 more changes"  # its label, the two rules it removed
    )


def test_a_rule_of_a_plug_in_no_longer_registered_is_still_named():
    assert rule_name(row(type="gone_plugin", total=5, label="QUOTA")) == "gone_plugin(total=5) [QUOTA]"
