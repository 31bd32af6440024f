"""Replace the whole policy store with a policy file (YAML or JSON), or change nothing."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from core import ConfigError
from policies.models import Tier
from policies.policyfile import load_policy, read_file, refusal
from policies.signals import acting_as

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


class Command(BaseCommand):
    help = (
        "Load a policy file (SPEC.md's format) into the store, replacing everything in it, in one "
        "transaction. On the first error nothing changes and the command exits non-zero, naming the "
        "field. FILE may also name a file in policies/fixtures without its .yaml (e.g. `demo`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument(
            "--if-empty",
            action="store_true",
            help="load only into an empty store (no tiers yet), so edits survive restarts",
        )

    def handle(self, *args, file, if_empty, **options):
        path = self._resolve(file)
        try:
            if if_empty and Tier.objects.exists():
                self.stdout.write("The policy store is not empty; left as it is.")
                return
            with acting_as(f"loadpolicies {path.name}"):
                checked = load_policy(read_file(path))
        except ConfigError as error:
            raise CommandError(refusal(path, error)) from None
        except DatabaseError as error:
            # One transaction: a load that fails part way leaves the store as it was.
            raise CommandError(f"the policy database is unreachable; nothing was loaded: {error}") from None
        self.stdout.write(
            f"Loaded {path}: {len(checked['levels'])} levels, {len(checked['tiers'])} tiers, "
            f"{len(checked['tenants'])} tenants, {len(checked['priorities'])} priority classes."
        )

    @staticmethod
    def _resolve(file: str) -> Path:
        path = Path(file)
        fixture = FIXTURES / f"{file}.yaml"
        if not path.exists() and path.suffix == "" and fixture.exists():
            return fixture
        return path
