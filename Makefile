# Set-up and everyday commands. Every target installs what it needs first.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The in-process store lives in one process, so without Redis there must be one worker;
# with REDIS_URL the state is shared and several workers can serve.
WORKERS := $(if $(REDIS_URL),4,1)

.PHONY: venv test run bench clean

venv: $(STAMP)

# A stamp file, so the venv is rebuilt only when a requirements file changes.
$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -r requirements-dev.txt
	touch $@

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput
# The demo policies, only into an empty store: operators' edits survive a restart.
	$(BIN)/python manage.py loadpolicies --if-empty demo
	$(BIN)/python manage.py ensureoperator
# limiter_admin/gunicorn_conf.py: no control socket, and /metrics adds up every worker.
	$(BIN)/gunicorn limiter_admin.wsgi -c python:limiter_admin.gunicorn_conf -b 127.0.0.1:8000 -w $(WORKERS) --threads 8

bench: $(STAMP)
	$(BIN)/python bench/engine.py

# Keeps db.sqlite3: it holds the operator account and the policies.
clean:
	rm -rf $(VENV) staticfiles .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
