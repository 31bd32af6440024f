"""WSGI entry point, served by gunicorn (`make run`): Django's application, with chunked request
bodies read (limiter_admin/chunked.py), a gateway's calls served by their views directly
(limiter_admin/gateway_front.py), the heap frozen once warm (limiter_admin/warm_heap.py),
a short GIL switch interval, and the alerts evaluated in the process that serves."""

import os
import sys

from django.core.wsgi import get_wsgi_application

# How long a thread may hold the GIL while another waits for it: 1 ms, not Python's 5. A
# request thread back from Redis waited up to the whole interval while the flushing thread
# packed a batch or ran an alert round; at 1,000 decisions/s that was most of a decision's
# p99 (docs/OPERATIONS.md, "The garbage collector and the GIL").
SWITCH_INTERVAL = 0.001
sys.setswitchinterval(SWITCH_INTERVAL)

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
