from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    """Tiers, tenants, levels, priorities and the rules they carry."""

    name = "policies"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, signals, tokens  # noqa: F401  (checks and tokens register themselves)

        signals.connect()
