"""ASGI entry point, for servers that speak ASGI; the alerts are evaluated in the process that
serves, as under WSGI."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "limiter_admin.settings")

application = get_asgi_application()

# After Django's set-up, which the alerts' models need (limiter_admin/wsgi.py says why).
from policies.services.alerts import start_alerts  # noqa: E402

start_alerts()
