from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    """Tiers, tenants, levels, priorities and the rules they carry."""

    name = "policies"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, signals  # noqa: F401  (checks registers itself)

        signals.connect()
