"""Only staff get in: every page of the dashboard goes through the admin's login."""

import pytest
from django.contrib.auth import get_user_model

from tests.dashboard.conftest import DASHBOARD, text

PATHS = [
    DASHBOARD,
    DASHBOARD + "throttled/",
    DASHBOARD + "buckets/?level=team&key=acme",
    DASHBOARD + "dry-run/?level=team&key=acme&cost=1",
    DASHBOARD + "health/",
    DASHBOARD + "reset/?level=team&key=acme",
]


@pytest.mark.parametrize("path", PATHS)
def test_an_anonymous_visitor_is_sent_to_the_login_page(api, client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")


@pytest.mark.parametrize("path", PATHS)
def test_a_logged_in_user_who_is_not_staff_is_sent_to_the_login_page(api, client, path):
    client.force_login(get_user_model().objects.create_user("visitor", password="pw-for-tests"))
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")


def test_an_anonymous_reset_is_refused_and_resets_nothing(api, client, decide_client):
    from tests.dashboard.conftest import decide

    decide(decide_client, {"team": "acme"}, cost=400)
    response = client.post(DASHBOARD + "reset/", {"level": "team", "key": "acme"})
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert api.limiter_for("acme").inspect("team", "acme")[0]["state"]["tokens"] == 600


@pytest.mark.parametrize("path", PATHS)
def test_staff_without_any_model_permission_get_in(api, client, path):
    client.force_login(get_user_model().objects.create_user("oncall", password="pw-for-tests", is_staff=True))
    assert client.get(path).status_code == 200


def test_the_dashboard_is_an_admin_page(api, console):
    html = console.get(DASHBOARD).content.decode()
    assert '<div id="site-name"><a href="/admin/">Limiter Admin</a></div>' in html
    assert "Who is throttled, and by what" in html and "A key's live buckets" in html and "Health" in html
    assert 'href="/admin/logout/"' in html or 'action="/admin/logout/"' in html  # the admin's user tools


def test_the_admin_index_links_to_the_dashboard(api, console):
    html = console.get("/admin/").content.decode()
    assert 'id="dashboard-link" href="/admin/dashboard/"' in html
    assert "Open the operators' dashboard" in text(html)
    assert "Tenants" in html  # the applications are still listed below it


def test_other_methods_are_refused(api, console):
    for path in PATHS[:-1]:
        assert console.post(path.split("?")[0]).status_code == 405
    assert console.put(DASHBOARD + "reset/").status_code == 405
