# Set-up and everyday commands. Every target installs what it needs first.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The in-process store lives in one process, so without Redis there must be one worker;
# with REDIS_URL the state is shared and several workers can serve.
WORKERS := $(if $(REDIS_URL),4,1)
# Envoy's rate limit service (gRPC), served by gunicorn's workers beside the REST API, on the
# same store (limiter_admin/gunicorn_conf.py). RLS_BIND= (empty) turns it off.
RLS_BIND ?= 127.0.0.1:8081
# Where the console and the REST API listen (127.0.0.1:PORT).
PORT ?= 8000
# With REDIS_URL, the gateways' own pool of workers listens here, apart from the console's
# (bin/serve, docs/OPERATIONS.md); GATEWAY_BIND= (empty) serves both from one pool.
GATEWAY_BIND ?= $(if $(REDIS_URL),127.0.0.1:8001,)

# The Debian packages the tests need, installed by `make deps` when missing: the one list to
# extend. The Redis tests start their own redis-server, the browser tests drive Chromium
# (/usr/bin/chromium), the PostgreSQL run starts its own server from the postgresql package, and
# the forward-auth tests run nginx (nginx-light, built with auth_request) and Caddy in front of it.
TEST_PACKAGES := redis-server chromium postgresql nginx-light caddy
# Debian's python3 makes no venv without python3-venv; another Python (pyenv's) needs nothing.
VENV_PACKAGES = $(if $(wildcard $(STAMP)),,$(shell $(PYTHON) -c 'import ensurepip' 2>/dev/null || echo python3-venv))
# The tests that run a second time, on a PostgreSQL server the session starts (tests/postgres.py).
POSTGRES_TESTS := tests/policies tests/api tests/dashboard tests/security

.PHONY: deps venv lint test test-postgres run bench clean
# Each step in the order written, even under -j: the packages before the tests that use them.
.NOTPARALLEL:

deps:
	@bin/deps $(TEST_PACKAGES)

venv: $(STAMP)

# A stamp file, so the venv is rebuilt only when a requirements file changes.
$(STAMP): requirements.txt requirements-dev.txt
	@bin/deps $(VENV_PACKAGES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -r requirements-dev.txt
	touch $@

# ruff, mypy and import-linter take their settings (and mypy its files) from pyproject.toml;
# lint-imports checks the layers of docs/ARCHITECTURE.md.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# Exit 5 is "no test selected": PYTEST_ARGS='-k name' may pick none of these directories.
PYTEST_POSTGRES = $(BIN)/python -m pytest --database=postgres $(POSTGRES_TESTS) $(PYTEST_ARGS) || [ $$? -eq 5 ]

# LiteLLM's proxy, for the LLM gateway tests (tests/gateways/test_litellm.py), in a virtualenv
# of its own: litellm[proxy] pins gunicorn and rich to versions that ours cannot share.
LITELLM_VENV := .venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.installed

$(LITELLM_STAMP): requirements-litellm.txt
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -r requirements-litellm.txt
	touch $@

# Every test on SQLite, then the database's users again on PostgreSQL.
test: deps $(STAMP) $(LITELLM_STAMP) lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(PYTEST_POSTGRES)

test-postgres: deps $(STAMP)
	$(PYTEST_POSTGRES)

run: $(STAMP)
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput
# The demo policies, only into an empty store: operators' edits survive a restart.
	$(BIN)/python manage.py loadpolicies --if-empty demo
	$(BIN)/python manage.py ensureoperator
# bin/serve: gunicorn with limiter_admin/gunicorn_conf.py (no control socket, /metrics adds up
# every worker, each worker serves gRPC on RLS_BIND), in one pool or two. Ctrl-C stops all.
	PORT='$(PORT)' RLS_BIND='$(RLS_BIND)' GATEWAY_BIND='$(GATEWAY_BIND)' WORKERS='$(WORKERS)' BIN='$(BIN)' bin/serve

bench: $(STAMP)
	$(BIN)/python bench/engine.py

# Keeps db.sqlite3: it holds the operator account and the policies.
clean:
	rm -rf $(VENV) $(LITELLM_VENV) staticfiles .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
