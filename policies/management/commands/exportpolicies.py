"""Write the policy store as a policy file (YAML, or JSON for a .json name); stdout without FILE."""

from pathlib import Path

from django.core.management.base import BaseCommand

from policies.policyfile import dump, export_policy


class Command(BaseCommand):
    help = "Export the policy store in SPEC.md's format: YAML, or JSON when FILE ends in .json."

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?")

    def handle(self, *args, file, **options):
        text = dump(export_policy(), file)
        if file:
            Path(file).write_text(text, encoding="utf-8")
            self.stdout.write(f"Wrote {file}.")
        else:
            self.stdout.write(text, ending="")
