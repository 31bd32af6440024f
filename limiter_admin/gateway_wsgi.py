"""The gateways' pool's entry point, served by granian (bin/serve, docs/OPERATIONS.md):

    granian --interface wsgi limiter_admin.gateway_wsgi:application --workers 4 --blocking-threads 8

limiter_admin.wsgi's application, and in each worker what limiter_admin/gunicorn_conf.py's
hooks do for a gunicorn worker. granian forks its workers and each one imports its target,
so this module runs once per worker, after the fork:

- with RLS_BIND (host:port; unset or empty: off), the worker serves Envoy's rate limit
  service (gRPC) on that port too, beside the other workers (SO_REUSEPORT), on the worker's
  own store, and stops it when the worker exits;
- in Prometheus's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, which bin/serve gives the
  pool), a worker that exits marks its files dead, so that /metrics drops its live gauges.

Nothing here runs under gunicorn, whose hooks do the same: gunicorn serves limiter_admin.wsgi.
"""

import atexit
import os

from limiter_admin.wsgi import application

__all__ = ["application"]


def _serve_grpc(bind: str) -> None:
    # Only with RLS_BIND: gRPC's threads start in the worker that serves, never on import alone.
    from policies.rls_service import start_server

    server = start_server(bind, reuse_port=True)
    atexit.register(lambda: server.stop(grace=1).wait())


def _mark_dead_on_exit(pid: int) -> None:
    from prometheus_client import multiprocess

    atexit.register(multiprocess.mark_process_dead, pid)


if os.environ.get("RLS_BIND"):
    _serve_grpc(os.environ["RLS_BIND"])
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _mark_dead_on_exit(os.getpid())
