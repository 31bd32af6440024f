"""The project's URLs: the REST API and its schema, the admin console, and the probes."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from limiter_admin import views
from policies.api import errors as api_errors

urlpatterns = [
    # The site's root is the console's dashboard (the admin's login first, for a visitor).
    path("", RedirectView.as_view(pattern_name="admin:dashboard"), name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
    path("api/v1/", include("policies.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/", admin.site.urls),
]

# Unknown API paths, refused bodies (too large) and bugs answer in the API's error shape,
# not as HTML pages.
handler400 = views.by_path(api_errors.bad_request, views.html_bad_request)
handler404 = views.by_path(api_errors.page_not_found, views.page_not_found)
handler500 = views.by_path(api_errors.server_error, views.html_server_error)
