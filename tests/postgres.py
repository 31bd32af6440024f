"""A real PostgreSQL server for the tests, and `pytest --database=postgres`.

The session starts its own server from Debian's postgresql package (the newest
/usr/lib/postgresql/<version>/bin, else pg_ctl on PATH): a throwaway data directory, a free
loopback port, trust authentication for the superuser `postgres`. pytest-postgresql's
`PostgreSQLExecutor` runs initdb and pg_ctl; its own `postgresql_proc` fixture is not used,
because initdb refuses to run as root, and CI runs as root. So when root, every pg_ctl call
goes through `runuser -u postgres` (the account the package creates) and the directory is
that account's; anyone else runs the server as themselves.

`--database=postgres` points Django's `default` database at that server, through
pytest-django's `django_db_modify_db_settings`: the same tests then run on PostgreSQL.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import port_for
import pytest
from pytest_postgresql.executors import PostgreSQLExecutor

SUPERUSER = "postgres"
STARTUP_TIMEOUT = 60  # seconds for initdb, and for the server to take connections
# Durability off: a test server's data is thrown away, and each flush of a transactional
# test would otherwise wait for the disk.
SERVER_OPTIONS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="the database of the tests that use Django's: SQLite (settings' default) or a PostgreSQL "
        "server the session starts",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"database: {config.getoption('database')}"


def pytest_runtest_setup(item: pytest.Item) -> None:
    on_postgres = item.config.getoption("database") == "postgres"
    if item.get_closest_marker("postgres") and not on_postgres:
        pytest.skip("PostgreSQL's own behaviour: runs with --database=postgres")
    if item.get_closest_marker("sqlite") and on_postgres:
        pytest.skip("the same code on any database: runs on SQLite's pass only")


def pg_ctl_path() -> str:
    """The newest installed PostgreSQL's pg_ctl: Debian keeps each major version apart."""
    found = glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")
    if found:
        return max(found, key=lambda path: int(re.search(r"/(\d+)/bin/", path).group(1)))
    on_path = shutil.which("pg_ctl")
    if on_path is None:
        pytest.fail(
            "no pg_ctl: the PostgreSQL tests need a server installed "
            "(`make deps` installs Debian's postgresql, or: apt-get install postgresql)",
            pytrace=False,
        )
    return on_path


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1:`port`, its data in a directory of its own."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="limiter-postgres-"))
        self.port = port_for.select_random()
        pg_ctl = pg_ctl_path()
        if os.geteuid() == 0:
            pg_ctl = self._as_postgres(pg_ctl)
        self.executor = PostgreSQLExecutor(
            executable=pg_ctl,
            host="127.0.0.1",
            port=self.port,
            datadir=str(self.directory / "data"),
            unixsocketdir=str(self.directory),
            logfile=str(self.directory / "postgresql.log"),
            startparams="-w",
            dbname="postgres",
            user=SUPERUSER,
            timeout=STARTUP_TIMEOUT,
            postgres_options=SERVER_OPTIONS,
        )

    def _as_postgres(self, pg_ctl: str) -> str:
        """A pg_ctl that runs as the `postgres` account, in a directory that account owns."""
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root, and there is no `postgres` account to run the server as", pytrace=False)
        os.chown(self.directory, account.pw_uid, account.pw_gid)
        wrapper = self.directory / "pg_ctl"
        # From its own directory: the tests' working directory may be closed to that account.
        wrapper.write_text(f'#!/bin/sh\ncd "{self.directory}" && exec runuser -u postgres -- "{pg_ctl}" "$@"\n')
        wrapper.chmod(0o755)
        return str(wrapper)

    def start(self) -> PostgresServer:
        try:
            self.executor.start()
            # Its port opens before the server takes connections ("the database system is
            # starting up"); `pg_ctl start -w` exits 0 only once it takes them.
            if self.executor.process.wait(STARTUP_TIMEOUT) != 0:
                raise RuntimeError("pg_ctl start failed")
        except Exception:
            log = self.directory / "postgresql.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            with contextlib.suppress(Exception):  # a server half started is stopped too
                self.executor.stop()
            self.remove()
            pytest.fail(f"PostgreSQL did not start on port {self.port}:\n{tail}", pytrace=False)
        return self

    def url(self, name: str = "postgres") -> str:
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.executor.running():
            self.executor.stop()
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server, started on first use and stopped at the end."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, request) -> None:
    """With --database=postgres, Django's `default` database is a database on the session's
    server (pytest-django creates `test_limiter` there, and drops it at the end)."""
    if request.config.getoption("database") != "postgres":
        return
    from django.conf import settings
    from django.db import connections

    server = request.getfixturevalue("postgres_server")
    # In place: Django's connection handler holds these very dicts.
    settings.DATABASES["default"].update(
        ENGINE="django.db.backends.postgresql",
        NAME="limiter",
        USER=SUPERUSER,
        PASSWORD="",
        HOST="127.0.0.1",
        PORT=str(server.port),
        OPTIONS={},
    )
    # A connection made before now (at import, say) would still be SQLite's.
    connections["default"].close()
    del connections["default"]


def wait_for_a_lock_wait(timeout: float = 10.0) -> bool:
    """Until some session of the server waits for a lock that another holds; False if none
    has after `timeout` seconds. Lets a test hold one transaction open until a second one
    is really blocked behind it."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if cursor.fetchone()[0]:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)  # polling another session's progress, not an edge: any pace will do


class Writer(threading.Thread):
    """`work()` in a thread of its own, on a connection of its own, closed when done."""

    def __init__(self, name: str, work) -> None:
        super().__init__(name=name)
        self.work, self.result, self.error = work, None, None

    def run(self) -> None:
        try:
            self.result = self.work()
        except Exception as error:  # the test reads it
            self.error = error
        finally:
            from django.db import connections

            connections.close_all()

    def outcome(self):
        self.join(30)
        assert not self.is_alive(), f"{self.name} never finished"
        if self.error is not None:
            raise self.error
        return self.result


@contextlib.contextmanager
def held_open(model, writer_name: str):
    """The writer named `writer_name`, once it has saved a `model` row inside its transaction,
    holds that transaction open until another one waits for a lock. Yields an event set when
    it is holding, and a list that says whether the other really waited."""
    from django.db.models.signals import post_save

    holding, waited = threading.Event(), []

    def hold(sender, **kwargs):
        if threading.current_thread().name == writer_name and not holding.is_set():
            holding.set()
            waited.append(wait_for_a_lock_wait())

    post_save.connect(hold, sender=model, weak=False, dispatch_uid="held-open")
    try:
        yield holding, waited
    finally:
        post_save.disconnect(sender=model, dispatch_uid="held-open")
