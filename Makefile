# cronops: `make demo` and `make test` do all the set-up on a machine with Python 3.11+.
# The distribution's Python when it is 3.11+ and makes a virtualenv (tried in a scratch
# directory: on Debian, importing ensurepip proves nothing), else the first python3 on PATH
# (`make PYTHON=...` to choose). On Debian it is the Python the deploy runs the app with, and an
# optimised build: against pyenv's default build of 3.11 here, 18 % fewer instructions for a
# `manage.py` command, 14 % less CPU for tests/test_deploy.py. Expanded only to make $(VENV).
PYTHON ?= $(shell for p in /usr/bin/python3 python3; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 || continue; \
	d=$$(mktemp -d) && "$$p" -m venv "$$d/venv" >/dev/null 2>&1; ok=$$?; rm -rf "$$d"; \
	[ $$ok = 0 ] && { echo "$$p"; exit 0; }; done; echo python3)
# The suite starts hundreds of Python processes: they must find the bytecode caches (gitignored)
# that the first of them writes. With PYTHONDONTWRITEBYTECODE exported (Docker's python images
# do) each one compiled ops/ and the tests again: `make test` took 9 min 45 s - 9 min 52 s here
# with it, 7 min 46 s without. Copies the tests make still write none (tests/conftest.py).
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
# The newest pair of the version matrix (README, "Supported versions"): the newest Python 3.12+
# found (on PATH, else pyenv's), with the newest Django pip resolves, in a second virtualenv.
NEWEST_VENV := .venv-newest
NEWEST_PY := $(NEWEST_VENV)/bin/python
PYTHON_NEWEST ?= $(shell for v in 3.14 3.13 3.12; do \
	for p in "$$(command -v python$$v)" "$$(pyenv prefix $$v 2>/dev/null)/bin/python$$v" \
	    $$(ls -d "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/$$v.*/bin/python$$v 2>/dev/null | sort -V -r); do \
	  if [ -x "$$p" ] && "$$p" -c "" 2>/dev/null; then echo "$$p"; exit 0; fi; \
	done; done)
# The demo never touches a real .env's database or healthchecks project: empty values win
# over .env (the environment always does).
DEMO := OPS_VAR_DIR=var/demo OPS_CRONTAB_DIR=crontab.d DATABASE_URL= HEALTHCHECKS_PING_KEY= \
	HEALTHCHECKS_API_KEY= TIME_ZONE=UTC
# The suite runs in parallel (pytest-xdist): two workers per CPU, since many tests wait on
# processes of their own. `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) * 2 )))
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)
# The PostgreSQL and newest-pair stages, which run beside the main one: half as many.
XDIST_SIDE = $(if $(filter 0 1,$(PYTEST_WORKERS)),,-n $$(( $(PYTEST_WORKERS) / 2 )) --dist loadgroup)
.PHONY: demo check check-clocks test test-postgresql test-newest lint bench faults clean screenshots dist

$(PY):
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }
	$(PY) -m pip install -q --upgrade pip

# The example project (config/, commands/) needs the `example` extra besides the app.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[example]'
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

# -U: the newest Django (and the rest) each time pyproject.toml changes.
$(NEWEST_VENV)/.dev-installed: pyproject.toml
	rm -rf $(NEWEST_VENV)
	$(PYTHON_NEWEST) -m venv $(NEWEST_VENV)
	$(NEWEST_PY) -m pip install -q --upgrade pip
	$(NEWEST_PY) -m pip install -q -U -e '.[dev]'
	touch $@

# A demo command, shown as a person types it: the environment above is the demo's own and is
# not echoed (it would bury the command).
demo_run = echo '$$ python manage.py $(1)'; $(DEMO) $(PY) manage.py $(1)

demo: $(VENV)/.installed
	@rm -rf var/demo
	@echo "The demo has a database of its own (var/demo/), TIME_ZONE=UTC and no healthchecks.io pings."
	@$(call demo_run,migrate -v0)
	@$(call demo_run,seed_demo)
	@# charge_daily runs at 03:00 (crontab.d/10-billing.cron): a run serves the latest 03:00.
	@if [ "$$(date -u +%H)" -lt 3 ]; then \
	  day=$$(date -u -d yesterday +%F); why="before 03:00, so yesterday's"; \
	else day=$$(date -u +%F); why="after 03:00, so today's"; fi; \
	echo; echo "--- 1. charge_daily runs at 03:00 UTC ('0 3 * * *'); a run serves the latest 03:00."; \
	echo "    It is $$(date -u +%H:%M): $$why slot, logical date $$day. It charges every"; \
	echo "    subscription once for that date."
	@$(call demo_run,run_job charge_daily)
	@echo; echo "--- 2. The same slot again: already done, nothing charged, exit 0."
	@$(call demo_run,run_job charge_daily)
	@echo; echo "--- 3. --force runs the slot again; charge_daily itself charges nobody twice."
	@$(call demo_run,run_job --force charge_daily)
	@echo; echo "--- 4. A past logical date, by hand."
	@$(call demo_run,run_job --logical-date=2026-01-15 charge_daily)
	@echo; echo "--- 5. The lock: a second run while the first holds it exits 75, naming the holder."
	@echo '$$ python manage.py run_job sleep_demo --seconds=3 &'; \
	  $(DEMO) $(PY) manage.py run_job sleep_demo --seconds=3 & sleep 1.5; \
	  $(call demo_run,run_job sleep_demo --seconds=3); echo "exit code $$?"; wait
	@echo; echo "--- 6. A Django task (commands/tasks.py) on the schedule: summarise-charges enqueues it"
	@echo "    once per logical date, after charge_daily succeeded for that date (--after), in the"
	@echo "    transaction that records the slot done; task-worker, django-tasks-db's worker as a"
	@echo "    cron job after it (--after=summarise-charges), then runs what is queued."
	@day=$$(if [ "$$(date -u +%H)" -lt 3 ]; then date -u -d yesterday +%F; else date -u +%F; fi); \
	  for job in summarise-charges summarise-charges task-worker; do \
	    echo "\$$ python manage.py run_job --logical-date=$$day $$job"; \
	    $(DEMO) $(PY) manage.py run_job --logical-date=$$day $$job; \
	  done
	@echo; echo "--- 7. The history, newest first."
	@$(call demo_run,job_history)
	@echo; echo "--- 8. One row per job; exit 1 while a job is not ok (here: the others never ran)."
	@echo "    LAST SUCCESS: the slot the latest success served (its date is the logical date), and"
	@echo "    when it ran if that was late. LAG: how long after its slot the latest run of a then"
	@echo "    current slot started (cron starts one within seconds; the demo ran it by hand)."
	@$(call demo_run,job_status); echo "exit code $$?"

# The loop to run while working: lint, types, and the tests that start no process or service
# of their own (`-m "not process"`), in well under a minute. One file or one test:
# `.venv/bin/python -m pytest tests/test_slots.py` or `... tests/test_slots.py::test_name`.
check: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not process" -n 2 $(PYTEST_ARGS)

# `make check`'s tests under libfaketime (Debian's faketime), the wall clock set to instants
# where a test that reads it would fail: either side of midnight UTC, and both DST nights of
# 2027 in Berlin (TZ=Europe/Berlin): 01:59:30 local, just before the spring jump, and 03:00:30,
# just after it (02:30 does not exist that night); the two 02:30s of the autumn night, given
# as the UTC instants 00:30 and 01:30. Only the wall clock is faked: with the monotonic clock
# faked too, libfaketime 0.9.10 hangs Python's timed waits.
CLOCKS := "2027-01-01 23:59:30 UTC" "2027-01-02 00:00:30 UTC" "2027-03-28 01:59:30" \
	"2027-03-28 03:00:30" "2027-10-31 00:30:00 UTC" "2027-10-31 01:30:00 UTC"
check-clocks: $(VENV)/.dev-installed
	@for clock in $(CLOCKS); do \
	  echo "--- make check's tests at $$(TZ=Europe/Berlin faketime "$$clock" date -u '+%F %T UTC')," \
	    "$$(TZ=Europe/Berlin faketime "$$clock" date '+%T %Z') in Berlin"; \
	  TZ=Europe/Berlin DONT_FAKE_MONOTONIC=1 faketime "$$clock" \
	    $(PY) -m pytest -m "not process" -q $(PYTEST_ARGS) || exit 1; \
	done

# Everything: lint, types, the whole suite (every real part: PostgreSQL, cron, Chromium,
# Ansible; in parallel), the in-process database tests again on PostgreSQL, and the newest
# Python + Django stage. Lint and the last two run beside the suite (mypy alone holds one CPU
# for 15-40 s; the side stages take the CPU the suite leaves while it waits); their output
# follows, from var/test/, and any failure of theirs fails `make test`.
SIDE_STAGES := lint test-postgresql test-newest
test: $(VENV)/.dev-installed
	@mkdir -p var/test; rm -f var/test/*.log var/test/*.rc
	@for stage in $(SIDE_STAGES); do \
	  { $(MAKE) --no-print-directory $$stage > var/test/$$stage.log 2>&1; \
	    echo $$? > var/test/$$stage.rc; } & \
	done; \
	$(PY) -m pytest $(XDIST) --durations=15 $(PYTEST_ARGS); main=$$?; \
	wait; failed=$$main; \
	for stage in $(SIDE_STAGES); do \
	  echo "--- make $$stage (ran beside the suite; var/test/$$stage.log)"; \
	  cat var/test/$$stage.log; \
	  [ "$$(cat var/test/$$stage.rc)" = 0 ] || failed=1; \
	done; \
	exit $$failed

# The tests that use Django's own test database in process, again on PostgreSQL (a test
# database of this run's own: another run on the same server keeps its own). The two property
# tests explore 15 sequences each here (60 and 30 on SQLite): PostgreSQL's own part, its row
# locks and isolation, shows in any sequence, and those 90 took 70 % of this stage's time.
PG_PROPERTY_EXAMPLES ?= 15
test-postgresql: $(VENV)/.dev-installed
	@if [ -n "$$CRONOPS_TEST_PG_URL" ]; then \
	  echo "--- the in-process database tests again, on PostgreSQL"; \
	  CRONOPS_PROPERTY_EXAMPLES=$${CRONOPS_PROPERTY_EXAMPLES:-$(PG_PROPERTY_EXAMPLES)} \
	  DATABASE_URL="$${CRONOPS_TEST_PG_URL%/*}/cronops_run_$$$$" \
	    $(PY) -m pytest -m inprocess_db $(XDIST_SIDE) $(PYTEST_ARGS); \
	else \
	  echo "--- no PostgreSQL for the in-process database tests (CRONOPS_TEST_PG_URL)"; \
	  if [ -n "$$CRONOPS_REQUIRE_ALL" ]; then exit 1; fi; \
	fi

# On the newest Python and Django: every test that starts no process (they are what a new
# Python or Django changes: models, migrations, admin, commands, argparse, signals, threads),
# and the process tests marked `newest` (the runner's processes and signals, claims racing
# through the database backends, run_job's command line, migrations). The deploys, crontab
# installs, pings, browsers and the rest run on the default pair only. Without a Python 3.12+
# it is skipped, and fails in CI (CRONOPS_REQUIRE_ALL=1).
test-newest:
	@if [ -z "$(PYTHON_NEWEST)" ]; then \
	  echo "--- no Python 3.12+ found for the newest pair (python3.13, python3.12 or pyenv)"; \
	  if [ -n "$$CRONOPS_REQUIRE_ALL" ]; then exit 1; fi; exit 0; \
	fi
	@$(MAKE) --no-print-directory $(NEWEST_VENV)/.dev-installed
	@echo "--- the in-process tests and the process tests marked newest, on the newest pair:" \
	  "$$($(NEWEST_PY) -c 'import sys, django; print("Python", sys.version.split()[0], "+ Django", django.get_version())')"
	$(NEWEST_PY) -m pytest -m "not process or newest" $(XDIST_SIDE) $(PYTEST_ARGS)

# sdist and wheel of the app (ops/ only) into dist/, checked with twine: build and twine are
# all it installs (the dev extra brings Ansible, Playwright, mypy and more).
dist: | $(PY)
	$(PY) -m pip install -q build twine
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check dist/*

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Benchmarks P1-P9 and fault scenarios F1-F12 (bench/RESULTS.md). Not part of `test`: they take
# minutes and measure the machine. F3 needs PostgreSQL (bash .ci/services.sh); F5 and F6 use
# root (a throwaway user, tmpfs mounts) when they have it. BENCH_ARGS=--quick for a smoke run,
# BENCH_ARGS=--only=P4,F2 for some.
bench: $(VENV)/.dev-installed
	$(PY) bench/run.py bench $(BENCH_ARGS)

faults: $(VENV)/.dev-installed
	$(PY) bench/run.py faults $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(NEWEST_VENV) dist var/demo var/screenshots

# docs/jobs-page.png and docs/job-calendar.png from the demo history (Debian's chromium)
screenshots: $(VENV)/.dev-installed
	$(PY) docs/screenshots.py

# install_crontab with 1,000 jobs (writes its section of bench/RESULTS.md)
bench-install: $(VENV)/.installed
	$(PY) bench/bench_install.py
