"""The API's docs page (/api/docs/, Swagger UI) in a real browser: its groups in order, the
decisions group opening on the decisions themselves (issue 25: it opened on ten /authz rows)."""

import pytest
from playwright.sync_api import expect

from .conftest import SCREENSHOTS

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("width", [1366, 390])
def test_the_docs_open_on_the_decisions_and_forward_auth_has_a_group_of_its_own(page, live_server, db, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto("/api/docs/")
    sections = page.locator(".opblock-tag-section")
    expect(sections.first.locator(".opblock-summary-path").first).to_be_visible()
    names = [name.strip() for name in page.locator(".opblock-tag-section h3.opblock-tag").all_inner_texts()]
    groups = [name.split("\n")[0].split()[0] for name in names]
    assert groups[:3] == ["decisions", "reservations", "forward-auth"], names

    def paths(group: str) -> list[str]:
        section = sections.filter(has=page.locator(f'h3.opblock-tag[data-tag="{group}"]'))
        return [
            path.strip().replace("\u200b", "") for path in section.locator(".opblock-summary-path").all_inner_texts()
        ]

    assert paths("decisions") == ["/api/v1/decisions", "/api/v1/decisions/batch", "/api/v1/leases/{lease}/release"]
    assert len(paths("forward-auth")) == 10 and set(paths("forward-auth")) == {"/api/v1/authz", "/api/v1/authz/{rest}"}
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"api-docs-{width}.png"))
    assert page.outside == [] and page.errors == []
