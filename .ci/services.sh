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
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
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
cat > var/ci/env.sh <<ENV
export CRONOPS_TEST_PG_URL=postgres://postgres@127.0.0.1:$PGPORT/postgres
ENV
echo "services: cron running (pid $(pgrep -x cron | head -n 1)), PostgreSQL on 127.0.0.1:$PGPORT"
