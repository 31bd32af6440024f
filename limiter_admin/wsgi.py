"""WSGI entry point, served by gunicorn (`make run`): Django's application, with chunked request
bodies read (limiter_admin/chunked.py), a gateway's calls served by their views directly
(limiter_admin/gateway_front.py), the heap frozen once warm (limiter_admin/warm_heap.py),
and the alerts evaluated in the process that serves."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "limiter_admin.settings")

django_application = get_wsgi_application()

# After Django's set-up: the front imports the gateways' views.
from django.conf import settings  # noqa: E402

from limiter_admin.chunked import ChunkedBodies  # noqa: E402
from limiter_admin.gateway_front import GatewayFront  # noqa: E402
from limiter_admin.warm_heap import FreezeWhenWarm  # noqa: E402

application = FreezeWhenWarm(ChunkedBodies(GatewayFront(django_application)), settings.LIMITER_GC_FREEZE_AFTER)

# After Django's set-up, which the alerts' models need: a serving process evaluates alerts
# every LIMITER_ALERT_EVERY seconds in its flushing thread (commands and tests do not).
from policies.services.alerts import start_alerts  # noqa: E402

start_alerts()
