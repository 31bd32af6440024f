"""The dashboard's one search box: tenants by key prefix from the database, and users seen
recently from the statistics, suggested as the operator types (htmx asks for a partial)."""

from tests.dashboard.conftest import DASHBOARD, decide, page, text

SEARCH = DASHBOARD + "search/"


def suggest(console, q):
    response = console.get(SEARCH, {"q": q}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return response.content.decode()


def test_the_dashboard_has_one_search_box_that_asks_as_you_type(api, console):
    html = page(console)
    assert html.count('type="search"') == 1
    assert f'hx-get="{SEARCH}" hx-trigger="input changed delay:200ms, search"' in html


def test_tenants_are_found_by_key_prefix_and_link_to_their_page(api, console):
    html = suggest(console, "a")
    assert 'data-tenant="acme"' in html and f'href="{DASHBOARD}tenants/acme/"' in html
    assert 'data-tenant="bigco"' not in html
    assert "<html" not in html  # a partial for htmx


def test_users_seen_recently_are_found_as_team_slash_user_with_links(api, decide_client, console):
    decide(decide_client, {"user": "alice", "team": "acme"})
    decide(decide_client, {"user": "alina", "team": "newco"})
    decide(decide_client, {"user": "bob", "team": "acme"})
    html = suggest(console, "ali")
    assert "acme / alice" in text(html) and "newco / alina" in text(html) and "bob" not in html
    assert f'href="{DASHBOARD}?level=user&amp;key=alice&amp;team=acme#buckets"' in html
    assert f'href="{DASHBOARD}tenants/newco/"' in html


def test_nothing_found_says_so_and_an_empty_box_suggests_nothing(api, console):
    assert "No tenant or recently seen user starts with “zz”." in text(suggest(console, "zz"))
    assert "<li" not in suggest(console, "")


def test_without_javascript_the_search_is_a_page_of_its_own(api, console):
    html = page(console, SEARCH, q="ac")
    assert "<html" in html and 'data-tenant="acme"' in html and 'value="ac"' in html


def test_an_exact_tenant_key_submitted_opens_its_page(api, console):
    response = console.get(SEARCH, {"q": "acme"})
    assert response.status_code == 302 and response["Location"] == f"{DASHBOARD}tenants/acme/"
    # Suggestions as one types stay suggestions; a prefix is still a page of results.
    assert console.get(SEARCH, {"q": "acme"}, HTTP_HX_REQUEST="true").status_code == 200
    assert console.get(SEARCH, {"q": "acm"}).status_code == 200
