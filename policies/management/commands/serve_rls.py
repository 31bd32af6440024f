"""`manage.py serve_rls --bind 127.0.0.1:8081`: Envoy's rate limit service (gRPC) until
interrupted (Ctrl-C, SIGTERM)."""

from __future__ import annotations

import os
import signal
import sys
import threading

from django.core.management.base import BaseCommand, CommandError

from core import MemoryStore
from policies.compile import policy_cache
from policies.rls_service import start_server

DEFAULT_BIND = "127.0.0.1:8081"


class Command(BaseCommand):
    help = "Serve Envoy's rate limit service (envoy.service.ratelimit.v3 ShouldRateLimit) over gRPC until interrupted."

    def add_arguments(self, parser):
        parser.add_argument(
            "--bind",
            default=os.environ.get("RLS_BIND") or DEFAULT_BIND,
            help=f"host:port to listen on (default: RLS_BIND, else {DEFAULT_BIND}; port 0 picks a free one)",
        )

    def handle(self, *args, bind: str, **options):
        if isinstance(policy_cache().store, MemoryStore):
            # The buckets live in this process: gunicorn's worker keeps its own (make run
            # serves gRPC inside that worker instead, sharing them).
            self.stderr.write(
                "warning: the in-process store (no REDIS_URL): this process counts alone, "
                "apart from any other serving the REST API"
            )
        try:
            server = start_server(bind)
        except RuntimeError as error:
            raise CommandError(str(error)) from None
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"Envoy's rate limit service (gRPC) on {bind.rsplit(':', 1)[0]}:{server.port}")
        sys.stdout.flush()
        stop.wait()
        server.stop(grace=2).wait()
