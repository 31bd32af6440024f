"""gunicorn settings shared by `make run`, the end-to-end tests and bench/http.py:

    gunicorn limiter_admin.wsgi -c python:limiter_admin.gunicorn_conf -b 127.0.0.1:8000 -w 4

With several workers, each keeps its own Prometheus counters; these hooks give them a
shared directory (prometheus-client's multiprocess mode) so /metrics adds them all up.

With RLS_BIND (host:port; unset or empty: off), each worker also serves Envoy's rate limit
service over gRPC (policies/rls_service.py), in its own process, so gRPC and REST decisions
share the worker's store, the in-process one included. The workers share the port
(SO_REUSEPORT); stopping gunicorn stops them all.
"""

import gc
import os
import shutil
import signal
import tempfile

from django.conf import settings

# Threads that keep connections alive (gthread): gateways hold pools of connections, and a
# decision over a kept-alive connection costs about half the server CPU of one on a new
# connection. sync closes each connection and uvicorn (Django's ASGI handler) cost 2.4x and 3.1x
# gthread's CPU per decision (docs/BENCHMARKS.md, "The decision path (issue 22)"). `--threads`
# or `-k` on the command line still wins. The gateways' own pool (bin/serve with Redis) is
# granian's instead (limiter_admin/gateway_wsgi.py): about 1.6x gthread's decisions per core.
worker_class = "gthread"
threads = 8

# Fail fast rather than queue: a gateway waiting on the limiter is worse than a 503.
timeout = 30
graceful_timeout = 10
control_socket_disable = True


_made_here: list[str] = []


def on_starting(server):
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        directory = tempfile.mkdtemp(prefix="limiter-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        _made_here.append(directory)
    # Counters of an earlier run would be added to this one's.
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)


def post_fork(server, worker):
    # How many threads a worker has: the console's admission takes half of them by default.
    os.environ["LIMITER_WORKER_THREADS"] = str(server.cfg.threads)
    # The console's pool, beside a pool of the gateways' own, runs at a lower CPU priority:
    # the kernel serves the gateways' decisions first (docs/OPERATIONS.md).
    nice = int(os.environ.get("LIMITER_WORKER_NICE") or 0)
    if nice:
        os.nice(nice)


def post_worker_init(worker):
    # Ctrl-C reaches the workers as well as the master, which then sends them SIGQUIT (its quick
    # stop). gthread's quick stop is not safe against a second signal: the SIGQUIT handler,
    # landing inside the SIGINT one, waited forever for a lock (ThreadPoolExecutor.shutdown's)
    # that the interrupted handler held, and the master SIGKILLed the worker after
    # graceful_timeout ("Perhaps out of memory?"). Both take the graceful stop instead (SIGTERM's
    # handler: a flag and a wake-up, safe in a signal handler): requests in flight are
    # answered, a request arriving on a kept-alive connection is answered with "Connection:
    # close", and idle ones are closed when their keep-alive runs out (bin/serve: 1 s).
    for signum in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, worker.handle_exit)
    bind = os.environ.get("RLS_BIND", "")
    if bind:
        # Here, after the fork: gRPC's threads must start in the process that serves.
        from policies.rls_service import start_server

        # SO_REUSEPORT, as the workers share gunicorn's HTTP socket: several workers serve
        # the one port.
        worker.rls_server = start_server(bind, reuse_port=True)


def pre_request(worker, req):
    worker.log.debug("%s %s", req.method, req.path)  # gunicorn's own pre_request
    # A body larger than Django takes is refused unread (the API's 400 malformed_request), and
    # gunicorn drains at most 64 KB of what a request leaves unread before it closes the
    # connection: say so in the answer ("Connection: close"), rather than promise keep-alive
    # and drop the connection under the client's next request.
    if content_length(req) > (settings.DATA_UPLOAD_MAX_MEMORY_SIZE or float("inf")):
        req.force_close()


def content_length(req) -> int:
    """The request's Content-Length (0 when it has none; gunicorn has refused a bad one)."""
    for name, value in req.headers:
        if name == "CONTENT-LENGTH":
            return int(value)
    return 0


def worker_exit(server, worker):
    rls = getattr(worker, "rls_server", None)
    if rls is not None:
        rls.stop(grace=1).wait()
    # The worker exits next. Python's last collection there only frees memory the kernel takes
    # back anyway, and walking a Django worker's heap took 0.5 s of CPU, more than the rest of
    # a Ctrl-C, and more again at the console pool's low priority: objects alive now are left
    # out of it. atexit handlers still run; a connection left open is closed with the process.
    gc.freeze()


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    for directory in _made_here:  # ours alone: an operator's own directory stays
        shutil.rmtree(directory, ignore_errors=True)
