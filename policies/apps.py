from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    """Tiers, tenants, levels, priorities and the rules they carry."""

    name = "policies"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imported once the app registry is ready, as Django asks of anything that imports
        # models; checks and tokens register themselves on import.
        from . import checks, signals, tokens  # noqa: F401

        signals.connect()
