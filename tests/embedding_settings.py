"""Settings for the embedded limiter's end-to-end tests (tests/policies/test_embedding_servers.py):
the app's settings, with tests/embedding_urls.py as the URLconf and the DRF throttle's setting.
The app itself ships no such view; this module adds them without touching it, as
bench/settings.py does.
"""

from limiter_admin.settings import *  # noqa: F401,F403

ROOT_URLCONF = "tests.embedding_urls"
# The DRF view's throttle: the tier "embed" of the policy the test loads.
LIMITER_THROTTLE = {"tier": "embed"}
