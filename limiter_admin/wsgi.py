"""WSGI entry point, served by gunicorn (`make run`): Django's application, with chunked request
bodies read (limiter_admin/chunked.py), and the alerts evaluated in the process that serves."""

import os

from django.core.wsgi import get_wsgi_application

from limiter_admin.chunked import ChunkedBodies

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "limiter_admin.settings")

application = ChunkedBodies(get_wsgi_application())

# After Django's set-up, which the alerts' models need: a serving process evaluates alerts
# every LIMITER_ALERT_EVERY seconds in its flushing thread (commands and tests do not).
from policies.services.alerts import start_alerts  # noqa: E402

start_alerts()
