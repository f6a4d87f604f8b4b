# Two commands matter: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv/ if missing, install the CPU build of torch 2.13.0 first (it lies on
# local disk; an unpinned torch would pull a multi-GB CUDA build), then this package.

VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-long bench lint docs data clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

# demo-sized A/B tests: 10,000 uploads per arm instead of the full study's 20,000 (same 4 batches,
# 4 replicates, optimiser and budget), so the 16 trials finish within 5 minutes (docs/tuning.md)
demo: $(STAMP)
	$(VENV)/bin/bayes-safe tune video-upload --trials 16 --parallel 2 --users 10000 --overwrite --out demo-output

# the Open Bandit Dataset sample ships inside the obp wheel on PyPI: fetched once into
# ~/.cache/bayes_safe/obp (or $$BAYES_SAFE_DATA/obp), never installed, never committed
data: $(STAMP)
	$(PY) -m bayes_safe.offline.open_bandit --fetch

# headless Chromium and its driver for tests/test_docs_render.py (Debian packages; needs root)
.PHONY: browser
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# PostgreSQL's server binaries for the tests that start a real server on 127.0.0.1 (tests/postgres.py;
# Debian's postgresql package, its binaries under /usr/lib/postgresql/*/bin; needs root)
.PHONY: postgres
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	fi

test: $(STAMP) data browser postgres
	$(PY) -m pytest -q --durations=15

test-slow: $(STAMP) data postgres
	$(PY) -m pytest -q -m slow --durations=15

# minutes each, not in CI: long reference chains, full-size targets, fresh-venv installs, the site built and
# rendered in Chromium (it reads the tutorials' results from `make test`'s execution cache when that ran first)
test-long: $(STAMP) data browser postgres
	$(PY) -m pytest -q -m long --durations=15

bench: $(STAMP)
	$(PY) benchmarks/run.py

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check bayes_safe tuning studies tests benchmarks

clean:
	rm -rf $(VENV) demo-output site
