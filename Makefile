# cronops: `make demo` and `make test` do all the set-up on a machine with Python 3.11+.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The demo never touches a real .env's database or healthchecks project: empty values win
# over .env (the environment always does).
DEMO := OPS_VAR_DIR=var/demo OPS_CRONTAB_DIR=crontab.d DATABASE_URL= HEALTHCHECKS_PING_KEY= \
	HEALTHCHECKS_API_KEY= TIME_ZONE=UTC
.PHONY: demo test lint bench faults clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	rm -rf var/demo
	$(DEMO) $(PY) manage.py migrate -v0
	$(DEMO) $(PY) manage.py seed_demo
	@echo "--- 1. first run of today's slot: charges every subscription once"
	$(DEMO) $(PY) manage.py run_job charge_daily
	@echo "--- 2. the same slot again: a no-op, exit 0"
	$(DEMO) $(PY) manage.py run_job charge_daily
	@echo "--- 3. --force re-runs the slot; the command itself charges nobody twice"
	$(DEMO) $(PY) manage.py run_job --force charge_daily
	@echo "--- 4. a past logical date, by hand"
	$(DEMO) $(PY) manage.py run_job --logical-date=2026-01-15 charge_daily
	@echo "--- 5. the lock: a second run while the first holds it exits 75"
	$(DEMO) $(PY) manage.py run_job sleep_demo --seconds=3 & sleep 1.5; \
	  $(DEMO) $(PY) manage.py run_job sleep_demo --seconds=3; echo "exit code $$?"; wait
	@echo "--- 6. the history"
	$(DEMO) $(PY) manage.py job_history
	@echo "--- 7. job_status: one row per job; exit 1 while some job is not ok (here: never run yet)"
	$(DEMO) $(PY) manage.py job_status; echo "exit code $$?"

test: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest $(PYTEST_ARGS)
	@if [ -n "$$CRONOPS_TEST_PG_URL" ]; then \
	  echo "--- the in-process database tests again, on PostgreSQL"; \
	  DATABASE_URL="$$CRONOPS_TEST_PG_URL" $(PY) -m pytest -m inprocess_db $(PYTEST_ARGS); \
	fi

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Benchmarks P1-P7 and fault scenarios F1-F7 (bench/RESULTS.md). Not part of `test`: they take
# minutes and measure the machine. F3 needs PostgreSQL (bash .ci/services.sh); F5 and F6 use
# root (a throwaway user, tmpfs mounts) when they have it. BENCH_ARGS=--quick for a smoke run,
# BENCH_ARGS=--only=P4,F2 for some.
bench: $(VENV)/.dev-installed
	$(PY) bench/run.py bench $(BENCH_ARGS)

faults: $(VENV)/.dev-installed
	$(PY) bench/run.py faults $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var/demo

# install_crontab with 1,000 jobs (writes its section of bench/RESULTS.md)
bench-install: $(VENV)/.installed
	$(PY) bench/bench_install.py
