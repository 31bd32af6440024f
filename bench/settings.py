"""Settings for bench/http.py only: the app's settings, with bench/urls.py as the URLconf.

    DJANGO_SETTINGS_MODULE=bench.settings gunicorn limiter_admin.wsgi -c python:limiter_admin.gunicorn_conf

The app itself ships no benchmark URL; this module adds one without touching it.
"""

from limiter_admin.settings import *  # noqa: F401,F403

ROOT_URLCONF = "bench.urls"
