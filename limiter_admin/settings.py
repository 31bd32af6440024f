"""Settings for the limiter_admin project, read from the environment.

See README.md ("Environment") for every variable. Nothing here needs editing to deploy.
"""

from datetime import timedelta
from pathlib import Path

import dj_database_url

from limiter_admin.env import env_bool, env_int, env_json, env_list, env_number, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

# The "django-insecure-" prefix makes `check --deploy` flag this key, so a deployment
# that forgot to set SECRET_KEY is caught by the check rather than in production.
DEV_SECRET_KEY = "django-insecure-dev-only-do-not-deploy-6b1f0c2e"
SECRET_KEY = env_str("SECRET_KEY", DEV_SECRET_KEY)
DEBUG = env_bool("DEBUG", True)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    # django.contrib.admin, on the console's own site (the dashboard's URLs): limiter_admin/apps.py
    "limiter_admin.apps.LimiterAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "simple_history",
    # Locks out an account after repeated failed logins (see "Login lockout" below).
    "axes",
    "policies",
]

# The console's own middleware is wrapped by limiter_admin.console_only: a gateway's call
# (a gateway path with a Bearer token, or no cookie) passes it by; the console keeps it all.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A DatabaseError in a page is a 503 with Retry-After, not a 500 (docs/OPERATIONS.md).
    "limiter_admin.middleware.DatabaseUnavailableMiddleware",
    # Right after SecurityMiddleware, as whitenoise asks: static files skip the rest.
    "limiter_admin.console_only.WhiteNoiseMiddleware",
    # The gateways first: console requests past LIMITER_CONSOLE_CONCURRENCY get 503 at once.
    "limiter_admin.admission.ConsoleAdmission",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "limiter_admin.console_only.AuthenticationMiddleware",
    "limiter_admin.console_only.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Records which operator made each change in the policy history.
    "limiter_admin.console_only.HistoryRequestMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout answer.
    "axes.middleware.AxesMiddleware",
]

# django-axes' backend first: it refuses a locked-out login before the password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "limiter_admin.urls"
WSGI_APPLICATION = "limiter_admin.wsgi.application"
ASGI_APPLICATION = "limiter_admin.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "limiter_admin" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=60,
    ),
}


def _caches(redis_url, limiter_timeout, batch_timeout):
    """django-redis when REDIS_URL is set, so workers share a cache; else per-process memory.

    The `limiter` alias is the rate limiter's own pool: short timeouts and no retries, so
    that a dead Redis costs a decision at most `limiter_timeout` before its fail mode
    applies. The `default` alias keeps redis-py's ordinary patience for everything else.
    """
    if not redis_url or redis_url.startswith("redis-cluster://"):
        # django-redis has no cluster client: on a cluster the limiter and the denial
        # statistics make their own (policies/stores.py), and Django's cache stays local.
        return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        },
        "limiter": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_url,
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.DefaultClient",
                "SOCKET_CONNECT_TIMEOUT": limiter_timeout,
                "SOCKET_TIMEOUT": limiter_timeout,
                "CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 0), "health_check_interval": 0},
            },
        },
        # Batches of decisions: the same fast connect, a longer wait for the pipeline's answers.
        "limiter_batch": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_url,
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.DefaultClient",
                "SOCKET_CONNECT_TIMEOUT": limiter_timeout,
                "SOCKET_TIMEOUT": max(limiter_timeout, batch_timeout),
                "CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 0), "health_check_interval": 0},
            },
        },
    }


# redis://host:port/db for one Redis; redis-cluster://host:port[,host:port...] for a cluster.
REDIS_URL = env_str("REDIS_URL")
# On a cluster: sub-buckets of each global-level key (docs/SCALING.md), the level whose key
# picks a decision's shard, and the levels split into sub-buckets.
LIMITER_CLUSTER_SHARDS = int(env_str("LIMITER_CLUSTER_SHARDS") or "16")
LIMITER_CLUSTER_SHARD_BY = env_str("LIMITER_CLUSTER_SHARD_BY") or "team"
LIMITER_CLUSTER_SPLIT = tuple(filter(None, (env_str("LIMITER_CLUSTER_SPLIT") or "global").split(",")))
# How those levels share their limit: "lease" (each process leases slices of it) or "split"
# (sub-buckets per shard); docs/SCALING.md compares them. A slice is this share of the limit.
LIMITER_CLUSTER_GLOBAL_MODE = env_str("LIMITER_CLUSTER_GLOBAL_MODE") or "lease"
LIMITER_CLUSTER_LEASE_FRACTION = float(env_str("LIMITER_CLUSTER_LEASE_FRACTION") or "0.02")
# Seconds a decision may wait on Redis before the level's fail mode decides instead.
LIMITER_STORE_TIMEOUT = float(env_str("LIMITER_STORE_TIMEOUT") or "0.05")
# Prefix of every key the limiter writes in Redis.
LIMITER_KEY_PREFIX = env_str("LIMITER_KEY_PREFIX") or "la"
# How rule state keys are named: "compact" (`la{<10 characters>}`, the least memory) or
# "readable" (`la:{user:u1}:<rule>`, for reading Redis by eye); core/stores/redis.py.
LIMITER_KEY_FORMAT = env_str("LIMITER_KEY_FORMAT") or "compact"
# Seconds a batch of decisions may wait for its answers (a batch is one pipeline).
LIMITER_BATCH_TIMEOUT = float(env_str("LIMITER_BATCH_TIMEOUT") or "1.0")
# How long each tenant's usage is kept: per minute for this many hours, per hour for this many
# days (docs/OPERATIONS.md gives the memory they take).
LIMITER_USAGE_MINUTE_HOURS = float(env_str("LIMITER_USAGE_MINUTE_HOURS") or "24")
LIMITER_USAGE_HOUR_DAYS = float(env_str("LIMITER_USAGE_HOUR_DAYS") or "30")
# The most recent decision requests kept for the what-if replay (0: none recorded, at no cost);
# in the statistics' Redis when REDIS_URL is set, else in the process. docs/OPERATIONS.md.
LIMITER_RECORD_LIMIT = int(env_str("LIMITER_RECORD_LIMIT") or "200000")
# A serving process freezes its heap (gc.freeze) after this many requests, so that the garbage
# collector's full collections skip what lives as long as the process (0: never);
# limiter_admin/warm_heap.py, docs/OPERATIONS.md.
LIMITER_GC_FREEZE_AFTER = env_int("LIMITER_GC_FREEZE_AFTER", 1000, minimum=0)
# What-if replays (POST /api/v1/whatif, Preview impact, manage.py whatif) run in processes of
# their own: this many at once in the whole deployment, this many more waiting in each worker,
# each stopped after this many seconds; a draft names at most so many tenants and rules.
# policies.E007 checks them; docs/OPERATIONS.md.
# Console requests (anything but the gateways' paths, limiter_admin/admission.py) running at
# once in one worker; more get 503 at once, so that the rest of the threads stay the gateways'.
# Unset: half the worker's threads (gunicorn's --threads; 8 under make run, so 4).
LIMITER_CONSOLE_CONCURRENCY = env_int("LIMITER_CONSOLE_CONCURRENCY", None)
# The admin's login form, per client address: this many posts at once, then this many a
# minute (limiter_admin/login_limit.py); the rest get 429 before any password is hashed.
LIMITER_LOGIN_ATTEMPTS = env_int("LIMITER_LOGIN_ATTEMPTS", 10)
LIMITER_LOGIN_PER_MINUTE = env_int("LIMITER_LOGIN_PER_MINUTE", 10)
LIMITER_WHATIF_CONCURRENCY = env_int("LIMITER_WHATIF_CONCURRENCY", 1)
LIMITER_WHATIF_QUEUE = env_int("LIMITER_WHATIF_QUEUE", 4)
LIMITER_WHATIF_SECONDS = env_int("LIMITER_WHATIF_SECONDS", 120)
LIMITER_WHATIF_MAX_TENANTS = env_int("LIMITER_WHATIF_MAX_TENANTS", 1000)
LIMITER_WHATIF_MAX_RULES = env_int("LIMITER_WHATIF_MAX_RULES", 5000)
# Envoy's rate limit service (manage.py serve_rls, POST /api/v1/rls/json; docs/GATEWAYS.md):
# the domain Envoy's ratelimit filter must send, and whether a call must carry a decide-scope
# service token (gRPC metadata `authorization: Bearer ...`).
LIMITER_RLS_DOMAIN = env_str("LIMITER_RLS_DOMAIN") or "limiter"
# Envoy's rate limit service spends tenants' limits: a call carries a decide-scope token unless
# this says otherwise, which only a loopback address may serve (policies.rls_service).
LIMITER_RLS_REQUIRE_TOKEN = env_bool("LIMITER_RLS_REQUIRE_TOKEN", True)
# Forward-auth (/api/v1/authz, docs/GATEWAYS.md): the request header that carries each level's
# key, as JSON; the global level's key is always "*" (policies.E005 checks the map).
LIMITER_AUTHZ_KEYS = env_json("LIMITER_AUTHZ_KEYS", {"user": "X-Limiter-User", "team": "X-Limiter-Team"})
# The least cost a forward-auth request may name in X-Limiter-Cost: below it is a 400. At the
# default cost, 1, a forged header can make a request dearer, never cheaper; 0: no floor
# (a cost above 0). policies.E006 checks it.
LIMITER_AUTHZ_MIN_COST = env_number("LIMITER_AUTHZ_MIN_COST", 1)
# The embedded limiter's client address (policies/embedding.py, docs/EMBEDDING.md): behind
# proxies, the header they append the caller's address to (e.g. X-Forwarded-For) and how
# many of them there are; unset, REMOTE_ADDR.
LIMITER_IP_HEADER = env_str("LIMITER_IP_HEADER") or None
LIMITER_IP_PROXIES = env_int("LIMITER_IP_PROXIES", 1)
# Whether a forward-auth request takes a concurrency slot when its X-Limiter-Slot does not say:
# off, since nginx and Caddy cannot give one back when the response ends (docs/GATEWAYS.md).
LIMITER_AUTHZ_SLOTS = env_bool("LIMITER_AUTHZ_SLOTS", False)
# OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} fields on every answer that
# carries the RateLimit fields (policies.services.openai_headers): off, since each answer then
# reads its rules' rooms from the store again, once per level.
LIMITER_OPENAI_HEADERS = env_bool("LIMITER_OPENAI_HEADERS", False)
# Alerts (docs/OPERATIONS.md, "Alerts"): each serving worker evaluates the tenants it saw
# every LIMITER_ALERT_EVERY seconds (0: no evaluation in this process), off the decisions'
# path; a delivery waits LIMITER_ALERT_TIMEOUT seconds for the receiver, and is tried
# LIMITER_ALERT_ATTEMPTS times, LIMITER_ALERT_BACKOFF seconds after the first failure, then
# twice as long after each next one. policies.E008 checks them.
LIMITER_ALERT_EVERY = env_number("LIMITER_ALERT_EVERY", 5.0)
LIMITER_ALERT_TIMEOUT = env_number("LIMITER_ALERT_TIMEOUT", 5.0)
LIMITER_ALERT_ATTEMPTS = env_int("LIMITER_ALERT_ATTEMPTS", 8)
LIMITER_ALERT_BACKOFF = env_number("LIMITER_ALERT_BACKOFF", 5.0)
CACHES = _caches(REDIS_URL, LIMITER_STORE_TIMEOUT, LIMITER_BATCH_TIMEOUT)
# Each alias its own pool, with its own timeouts (django-redis would share one per URL).
DJANGO_REDIS_CONNECTION_FACTORY = "limiter_admin.redis_pools.PoolPerSettingsFactory"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
# Times on the admin's pages as the console writes them, with their zone (limiter_admin/formats).
FORMAT_MODULE_PATH = ["limiter_admin.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# The dashboard's own scripts and the vendored front-end libraries (htmx, Chart.js): the
# project package is no app, so its static directory is named here.
STATICFILES_DIRS = [BASE_DIR / "limiter_admin" / "static"]
# Served at the site's root by whitenoise: /favicon.ico, which every browser asks for (a 404
# logged on every page before).
WHITENOISE_ROOT = BASE_DIR / "limiter_admin" / "root"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Compressed but not hashed names: a manifest would make every template that uses
    # {% static %} fail in tests unless collectstatic ran first. The price is a short
    # browser cache lifetime for the console's static files, which is fine for operators.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Tokens first: its Bearer challenge is what a 401 carries.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "policies.api.auth.ServiceTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["policies.api.auth.IsOperator"],
    "DEFAULT_PARSER_CLASSES": ["policies.api.parsers.FastJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "policies.api.errors.handle_exception",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Limiter Admin API",
    "DESCRIPTION": "Rate-limit decisions, reservations and policy administration. "
    'Errors all have one shape: {"error": {"code", "message", "fields"}}.',
    "VERSION": "1",
    # The docs page's scripts come from drf-spectacular-sidecar's static files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # An alert's kind, and each kind alone (the alternatives of its window): names of their own.
    "ENUM_NAME_OVERRIDES": {
        "AlertKindEnum": "policies.invariants.ALERT_KINDS",
        "QuotaUsedKindEnum": ["quota_used"],
        "DeniedShareKindEnum": ["denied_share"],
    },
    # The groups of /api/docs/, in this order (Swagger UI shows the declared tags first).
    "TAGS": [
        {"name": "decisions", "description": "May this request go now? One, a batch, and a slot's release."},
        {"name": "reservations", "description": "Reserve an estimated cost; commit the real one, or cancel."},
        {"name": "forward-auth", "description": "One decision from a gateway's request headers (docs/GATEWAYS.md)."},
        {"name": "observe", "description": "Live buckets, denials, usage, quotas, and the what-if replay."},
        {"name": "policy", "description": "Tiers, tenants, levels, priority classes, settings and alerts."},
        {"name": "alerts", "description": "An alert's delivery log and test sends."},
    ],
    # The gateways' endpoints are plain Django views, described by DRF views of their own.
    "PREPROCESSING_HOOKS": ["policies.api.gateway.gateway_endpoints"],
    # The schema tells the truth about requests: unknown fields are refused, and names that
    # only the database knows (levels, tiers, priority classes) are listed as configured now.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "policies.api.schema_hooks.strict_request_bodies",
        "policies.api.schema_hooks.live_policy_names",
    ],
}

# Security (docs/SECURITY.md). Django's defaults already hold here and are stated so that
# a change is deliberate: pages may not be framed, a response's type is never sniffed, the
# Referer leaves only for this origin, session cookies are out of JavaScript's reach.
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# An operator's session lasts a working day, not Django's two weeks: a session key is the
# one credential the database holds in clear (docs/SECURITY.md, "What is stored").
SESSION_COOKIE_AGE = 12 * 60 * 60
# Origins (scheme://host[:port]) allowed to send the console's forms when they differ from
# the Host the proxy forwards, e.g. `https://limiter.example.com`; empty by default.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Behind a TLS-terminating proxy only: these would break plain-HTTP serving on loopback.
HTTPS_ONLY = env_bool("HTTPS_ONLY", False)
if HTTPS_ONLY:
    SECURE_SSL_REDIRECT = True
    # Probes and Prometheus scrape the worker directly, over plain HTTP inside the network:
    # a redirect would fail them. Neither carries a credential nor sets a cookie.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    # Trusted only because the proxy sets it: it must overwrite what a client sends.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = 365 * 24 * 60 * 60
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# Login lockout (django-axes): 5 failed admin logins for one username from one address lock
# that pair out for 15 minutes; each failure while locked out starts the 15 minutes again.
# Username and address together, so that nobody elsewhere can lock an operator out by
# guessing at their account; the price is that an attacker with many addresses gets 5
# guesses per address. An operator unlocks at once with `manage.py axes_reset`.
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# A good login forgets the failures before it: a typo or two never adds up over weeks.
AXES_RESET_ON_SUCCESS = True
# What axes keeps of a failed login's form: the password is always masked, and so are these.
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "csrfmiddlewaretoken"]
