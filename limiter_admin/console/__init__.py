"""The operators' console at /admin/dashboard/: the dashboard and the tenant pages.

One topic per module: `views` (the pages and partials, wired up by
`LimiterAdminSite.get_urls()`), `forms` (what an operator asks for), `panels` (the
dashboard's overview: who is throttled, the limiter's health, search), `buckets` (one key:
its live buckets, a dry run, a reset), `tenant` (one tenant's page) and `formatting`
(durations, numbers, colours, local times and the console's links). The data comes from
the service layer (policies.services) and the domain (policies.compile, policies.models,
...), never from the REST API (policies/api/).

Nothing is imported here: the views import models, and the admin site that wires them up
is made while the app registry loads.
"""
