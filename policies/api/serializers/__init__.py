"""The policy's shapes on the wire: tiers, tenants, levels, priority classes, the settings.

A tier's rules have the policy file's shape, rule specs by level name:

    {"name": "pro", "rules": {"user": [{"type": "sliding_window", "limit": 600, "window": 60}]},
     "version": 3}

Nothing here decides what is valid: the policy's invariants are `policies.invariants`' (a
row's own through its model's `full_clean`), as the admin and the policy file check them.
These modules only say where an error is (`rules.user.0.capacity`) and whether it is a 400
or a 409 (a conflict with what is stored). On top of that every serializer is strict: an
unknown field is refused, `version` is the optimistic lock of every row but the settings,
and a PUT must send every field (a forgotten field is an error, never a silent reset).

One module per resource (`tiers`, `tenants`, `levels`, `priorities`, `settings`, `alerts`), on top of
`rules` (a tier's or tenant's rules by level, and their schema), `base` (StrictSerializer,
its request bodies in the schema, the model's own validation) and `fields` (strict scalars
and the fields several resources share). The resources' serializers are re-exported here
for the views (policies/api/crud.py).
"""

from .alerts import AlertSerializer, DeliverySerializer
from .levels import LevelSerializer
from .priorities import PrioritySerializer
from .settings import SettingsSerializer
from .tenants import TenantSerializer
from .tiers import TierSerializer

__all__ = [
    "AlertSerializer",
    "DeliverySerializer",
    "LevelSerializer",
    "PrioritySerializer",
    "SettingsSerializer",
    "TenantSerializer",
    "TierSerializer",
]
