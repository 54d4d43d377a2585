#!/usr/bin/env bash
# Install and start the services the test suite talks to: PostgreSQL and Debian's cron.
# Writes var/ci/env.sh with the variables the tests read. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
need=()
command -v crontab >/dev/null || need+=(cron)
[ -x /usr/sbin/cron ] || need+=(cron)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need+=(postgresql)
# headless browser for the admin test (driven by Playwright; never `playwright install`)
command -v chromium >/dev/null || need+=(chromium)
# the cron end-to-end test's Python for a throwaway user (see below)
# (Debian's python3 can import ensurepip without python3-venv, yet `-m venv` then fails.)
dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
# libfaketime: F7 (`make faults`) runs a private cron daemon on a fake clock through DST nights
command -v faketime >/dev/null || need+=(faketime)
# iproute2: the multi-server tests and F9 run each server in a network namespace of its own
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
# node_exporter and promtool for the metrics test (tests/test_prometheus.py starts its own
# node_exporter on a loopback port). The packages' own daemons are never started: without an
# init system invoke-rc.d would start them (node_exporter on :9100, prometheus on :9090), so a
# policy-rc.d that forbids it (exit 101) is in place during the install.
prom=()
[ -x /usr/bin/prometheus-node-exporter ] || prom+=(prometheus-node-exporter)
command -v promtool >/dev/null || prom+=(prometheus)
if [ ${#prom[@]} -gt 0 ]; then
  [ ${#need[@]} -gt 0 ] || apt-get update -qq
  policy=/usr/sbin/policy-rc.d
  added_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    added_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${prom[@]}" >/dev/null
  if [ -n "$added_policy" ]; then rm -f "$policy"; fi
fi

mkdir -p var/ci
# cron: start the daemon unless it runs (no systemd here).
if ! pgrep -x cron >/dev/null; then
  /usr/sbin/cron
fi

# PostgreSQL: a throwaway cluster owned by the postgres user, on a private port.
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
PGDATA=/tmp/cronops-pg
PGPORT=${CRONOPS_PG_PORT:-54329}
if ! "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT"; then
  rm -rf "$PGDATA"
  install -d -o postgres -g postgres "$PGDATA"
  su postgres -c "$PGBIN/initdb -D $PGDATA -A trust -U postgres >/dev/null"
  su postgres -c "$PGBIN/pg_ctl -s -D $PGDATA -o '-p $PGPORT -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off' -l $PGDATA/log start -w"
fi

# cron end to end (tests/test_cron_e2e.py): cron runs the test job as a throwaway user, who
# must be able to execute the project's Python. A pyenv interpreter under /root (mode 0700) is
# out of that user's reach, and opening /root (chmod o+x) would expose root's home to every
# user; so the test gets its own virtualenv from Debian's python3 under /opt, readable by all,
# with the runtime dependencies only, the app's and the example project's (the deployed copy
# under test brings its own code).
E2E_VENV=/opt/cronops-ci/venv
# Made again when the requirements differ from those it was made with (a checkout's mtimes
# say nothing about that).
E2E_REQUIREMENTS=$(/usr/bin/python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["example"]))')
if [ ! -x "$E2E_VENV/bin/python" ] || [ ! -e "$E2E_VENV/.installed" ] ||
   [ "$E2E_REQUIREMENTS" != "$(cat "$E2E_VENV/requirements.txt" 2>/dev/null)" ]; then
  rm -rf "$E2E_VENV"
  /usr/bin/python3 -m venv "$E2E_VENV"
  printf '%s\n' "$E2E_REQUIREMENTS" > "$E2E_VENV/requirements.txt"
  "$E2E_VENV/bin/pip" install -q --disable-pip-version-check -r "$E2E_VENV/requirements.txt"
  chmod -R a+rX /opt/cronops-ci
  touch "$E2E_VENV/.installed"
fi

cat > var/ci/env.sh <<ENV
export CRONOPS_TEST_PG_URL=postgres://postgres@127.0.0.1:$PGPORT/postgres
export CRONOPS_E2E_PYTHON=$E2E_VENV/bin/python
ENV
echo "services: cron running (pid $(pgrep -x cron | head -n 1)), PostgreSQL on 127.0.0.1:$PGPORT"
