"""Replay recent traffic under a draft policy file and print what would change, as a table."""

import datetime
import json
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from core import ConfigError, StoreUnavailable
from core.client import LimiterAPIError, LimiterClient, LimiterUnavailable
from policies.policyfile import read_file, refusal
from policies.services.errors import Busy, Invalid
from policies.services.usage import parse_window
from policies.services.whatif import MAX_TOP_TENANTS, TOP_TENANTS, what_if, what_if_table
from policies.telemetry import decision_recorder

TOKEN_VARIABLE = "LIMITER_TOKEN"
# How long the command waits for the server's answer: a replay may wait for a slot and then
# run for up to LIMITER_WHATIF_SECONDS each (120 s by default).
SERVER_TIMEOUT = 300.0
IN_PROCESS_NOTE = (
    "Note: without REDIS_URL the server records the decisions it makes in its own process, "
    "which this command cannot read: it replays only what it decided itself (nothing). Ask the "
    "running server instead: --server http://127.0.0.1:8000 with an admin-scope token in "
    f"{TOKEN_VARIABLE} (manage.py createservicetoken whatif --scope admin), or the console's "
    "Preview impact, or POST /api/v1/whatif; or run the server and this command with REDIS_URL."
)


class Command(BaseCommand):
    help = (
        "Replay the decision requests recorded in the last --window under the current policy and under "
        "FILE (a policy document as loadpolicies reads it, whole or partial, laid over the current policy) "
        "and print, per tenant, what the draft would deny or allow that the current policy does not. "
        "Nothing is saved. A bad FILE is refused as loadpolicies refuses it. With --server, the running "
        f"server replays what it recorded (POST /api/v1/whatif, an admin-scope token in {TOKEN_VARIABLE})."
    )

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--window", default="1h", help="how far back: 1s to 24h, e.g. 300, 5m, 1h (default 1h)")
        parser.add_argument("--top", type=int, default=TOP_TENANTS, help="tenants listed (default %(default)s)")
        parser.add_argument(
            "--server",
            metavar="URL",
            help="ask the server at URL (e.g. http://127.0.0.1:8000), which replays what it recorded; "
            f"needed without REDIS_URL, where the record lives in the server's process. Token: ${TOKEN_VARIABLE}",
        )

    def handle(self, *args, file, window, top, server, **options):
        try:
            seconds = parse_window(window)
        except Invalid as error:
            raise CommandError(f"--window {error.reason}") from None
        if not 1 <= top <= MAX_TOP_TENANTS:
            raise CommandError(f"--top must be from 1 to {MAX_TOP_TENANTS}")
        draft = self._read(file)
        report = (
            ask_server(server, file, draft, window, top) if server else self._replay_here(file, draft, seconds, top)
        )
        self.stdout.write(what_if_table(report))

    @staticmethod
    def _read(file: str) -> Any:
        try:
            return read_file(file)
        except ConfigError as error:
            raise CommandError(refusal(file, error)) from None

    def _replay_here(self, file: str, draft: Any, seconds: int, top: int) -> dict:
        recorder = decision_recorder()
        if recorder is not None and not recorder.shared:
            self.stderr.write(IN_PROCESS_NOTE)
        try:
            return what_if(draft, seconds, top)
        except ConfigError as error:
            raise CommandError(refusal(file, error)) from None
        except DatabaseError as error:
            raise CommandError(f"the policy database is unreachable: {error}") from None
        except StoreUnavailable as error:
            raise CommandError(f"the recorded requests cannot be read: {error}") from None
        except Busy as error:
            raise CommandError(str(error)) from None


def ask_server(url: str, file: str, draft: Any, window: str, top: int) -> dict:
    """The what-if of the server at `url`, for `draft` read from `file`; CommandError naming
    what went wrong (a refused draft as loadpolicies refuses the file)."""
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise CommandError(
            f"--server needs an admin-scope token in {TOKEN_VARIABLE}: "
            f"export {TOKEN_VARIABLE}=$(manage.py createservicetoken whatif --scope admin | tail -n 1)"
        )
    try:
        client = LimiterClient(url, token, timeout=SERVER_TIMEOUT)
    except ValueError as error:
        raise CommandError(f"--server {error}") from None
    with client:
        try:
            return client.what_if(json.loads(json.dumps(draft, default=_json_value)), window, top)
        except LimiterUnavailable as error:
            raise CommandError(f"no answer from the server: {error}") from None
        except LimiterAPIError as error:
            raise CommandError(_server_refusal(url, file, error)) from None


def _server_refusal(url: str, file: str, error: LimiterAPIError) -> str:
    if error.status in (400, 409) and error.fields:
        field, reason = next(iter(error.fields.items()))
        if field == "policy" or field.startswith("policy."):
            return refusal(file, ConfigError(reason, field.removeprefix("policy").removeprefix(".")))
    hint = f" (is {TOKEN_VARIABLE} an admin-scope token of that server?)" if error.status in (401, 403) else ""
    return f"{url} answered {error.status}: {error.message}{hint}"


def _json_value(value: Any) -> str:
    """What JSON cannot hold, as text the server reads (or refuses at its path): a YAML
    timestamp as ISO 8601."""
    return value.isoformat() if isinstance(value, datetime.date) else str(value)
