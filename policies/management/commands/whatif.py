"""Replay recent traffic under a draft policy file and print what would change, as a table."""

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from core import ConfigError, StoreUnavailable
from policies.policyfile import read_file, refusal
from policies.services.errors import Busy, Invalid
from policies.services.usage import parse_window
from policies.services.whatif import MAX_TOP_TENANTS, TOP_TENANTS, what_if, what_if_table


class Command(BaseCommand):
    help = (
        "Replay the decision requests recorded in the last --window under the current policy and under "
        "FILE (a policy document as loadpolicies reads it, whole or partial, laid over the current policy) "
        "and print, per tenant, what the draft would deny or allow that the current policy does not. "
        "Nothing is saved. A bad FILE is refused as loadpolicies refuses it."
    )

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--window", default="1h", help="how far back: 1s to 24h, e.g. 300, 5m, 1h (default 1h)")
        parser.add_argument("--top", type=int, default=TOP_TENANTS, help="tenants listed (default %(default)s)")

    def handle(self, *args, file, window, top, **options):
        try:
            seconds = parse_window(window)
        except Invalid as error:
            raise CommandError(f"--window {error.reason}") from None
        if not 1 <= top <= MAX_TOP_TENANTS:
            raise CommandError(f"--top must be from 1 to {MAX_TOP_TENANTS}")
        try:
            report = what_if(read_file(file), seconds, top)
        except ConfigError as error:
            raise CommandError(refusal(file, error)) from None
        except DatabaseError as error:
            raise CommandError(f"the policy database is unreachable: {error}") from None
        except StoreUnavailable as error:
            raise CommandError(f"the recorded requests cannot be read: {error}") from None
        except Busy as error:
            raise CommandError(str(error)) from None
        self.stdout.write(what_if_table(report))
