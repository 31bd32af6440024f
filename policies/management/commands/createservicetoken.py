"""Make a service token for a gateway or script; the token is printed alone on the last line."""

from django.core.management.base import BaseCommand, CommandError

from policies.tokens import SCOPES, issue_token


class Command(BaseCommand):
    help = (
        "Create an API token. `decide` may ask for decisions and reservations; `admin` may "
        "call everything. The token is shown once, on the last line: only its digest is stored."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="who will use the token, e.g. the gateway's name")
        parser.add_argument("--scope", default="decide", choices=SCOPES)

    def handle(self, *args, name, scope, **options):
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("name must be 1 to 100 characters")
        row, token = issue_token(name, scope)
        self.stdout.write(f"Created {scope} token {row.prefix} for {name!r}. Store it now: it is not shown again.")
        self.stdout.write(token)
