"""The project's URLs: the admin console and the health probe."""
from django.contrib import admin
from django.urls import path

from limiter_admin import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
]
