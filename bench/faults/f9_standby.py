"""F9: the same crontab on several servers, with standby (README, "Several servers").

Each server is a deployed copy of the project in a network namespace and a pid namespace of
its own (tests/netns.py: veth pairs, a private /24 each, a TCP forwarder to the one PostgreSQL
on 127.0.0.1), so to the claim's holder identity it is another machine: only the heartbeat
tells whether its run is alive. The job line has `--standby`.

  takeover    the holder is SIGKILLed mid-run while two standbys wait; measured from the kill
              to the start of the job on the standby that takes over, at two heartbeat
              settings. Must hold: within 3 heartbeats + 5 s; exactly one success per slot.
  fires       N slots (100), each fired on 3 servers at once. Must hold: every slot executed
              exactly once, every run exits 0 (one runs it, two report "done on <host>").
  tails       N slots (30), each with a random tail after the holder's job (issue 29): a
              leftover process that ignores SIGTERM (5 s to end it), pings to a server that
              never answers, a stdout nobody reads until the record (the job prints 1 MB), a
              failed first attempt and a wait before the retry; two standbys wait behind the
              holder, heartbeat 1 s (stale after 3 s). Must hold: every slot executed once,
              the standbys exit 0 ("done on"), nothing taken over or abandoned.
  load        N standbys (1, 5, 10) waiting behind a live holder, all on one server: the
              statements they send per second each, counted exactly by that server's forwarder
              (PostgreSQL's protocol: each 'Q' and each Sync), over a window; besides,
              pg_stat_database.xact_commit of the private database (which autovacuum and the
              holder's heartbeat also move). Goal: one read per poll interval (the heartbeat, at
              most 5 s): 0.2/s at the default 30 s heartbeat.

Needs root (namespaces) and PostgreSQL (bash .ci/services.sh).
Usage: python bench/faults/f9_standby.py [--fires 100] [--tails 30] [--seed N] [--window 60]
       [--parts takeover,fires,tails,load] [--quick]
"""

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import _path  # noqa: F401
from _common import REPO, PgDatabase, deployed_copy, env, goal, pg_url

sys.path.insert(0, str(REPO))
from tests.netns import Network, available, inner_pid

SLOT = """\
import os
import subprocess
import sys
import time

from django.core.management.base import BaseCommand

from ops import conf


class Command(BaseCommand):
    help = "Stamps 'start <date> <host> <time>', works, stamps 'end' (F9)."

    def add_arguments(self, parser):
        parser.add_argument("--logical-date", default="")
        parser.add_argument("--sleep", type=float, default=0.0)

    def handle(self, *args, **options):
        stamp, day = os.environ["BENCH_STAMP"], options["logical_date"]
        with open(stamp, "a") as f:
            f.write(f"start {day} {conf.host()} {time.time():.6f}\\n")
        failed = f"{stamp}.{day}.failed"
        if os.environ.get("BENCH_FAIL_FIRST") and not os.path.exists(failed):
            with open(failed, "w"), open(stamp, "a") as f:  # the tails: a retried attempt
                f.write(f"fail {day} {conf.host()} {time.time():.6f}\\n")
            raise SystemExit(3)
        hold = os.environ.get("HOLD", "")
        while hold and os.path.exists(hold):
            time.sleep(0.02)
        time.sleep(options["sleep"])
        if os.environ.get("BENCH_LEAVE"):  # a leftover that ignores SIGTERM
            ready = f"{stamp}.{day}.leftover"
            subprocess.Popen(["sh", "-c", f"trap '' TERM; touch {ready}; exec sleep 60"])
            while not os.path.exists(ready):
                time.sleep(0.01)
        if flood := int(os.environ.get("BENCH_FLOOD", "0")):
            sys.stdout.write("x" * flood + "\\n")
            sys.stdout.flush()
        with open(stamp, "a") as f:
            f.write(f"end {day} {conf.host()} {time.time():.6f}\\n")
"""
CRON = (
    "0 3 * * * --standby --no-ping bench_slot --sleep=0.3\n"
    "0 3 * * * --standby --name=bench-tail --retries=1 --retry-delay=4s bench_slot\n"
)
TAILS = ("leftover", "slow pings", "stalled reader", "retry wait")


class Server:
    def __init__(self, host, root: Path):
        self.host, self.root = host, root

    def start(self, day: str, job: str = "bench_slot", **extra) -> subprocess.Popen:
        argv = [sys.executable, str(self.root / "manage.py"), "run_job", f"--logical-date={day}"]
        return subprocess.Popen(
            self.host.wrap([*argv, job]),
            cwd=self.root,
            env=env(**extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def starts(stamp: Path, day: str, kind: str = "start") -> list[tuple[str, float]]:
    if not stamp.exists():
        return []
    found = []
    for line in stamp.read_text().splitlines():
        k, d, host, at = line.split()
        if k == kind and d == day:
            found.append((host, float(at)))
    return found


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def takeover(servers, pg, stamp: Path, heartbeat: float, trials: int, day0: int) -> None:
    times, ok = [], True
    hold = Path(tempfile.mkdtemp(prefix="cronops-f9-")) / "hold"
    for trial in range(trials):
        day = f"2001-01-{day0 + trial:02d}"
        hold.touch()
        beat = {"OPS_HEARTBEAT_SECONDS": heartbeat, "BENCH_STAMP": stamp}
        holder = servers[0].start(day, HOLD=hold, **beat)
        wait_until(lambda d=day: len(starts(stamp, d)) == 1, 60)
        standbys = [s.start(day, **beat) for s in servers[1:]]
        time.sleep(max(2.0, 2 * heartbeat))  # they stand by behind the live holder
        killed = time.time()
        os.kill(inner_pid(holder), signal.SIGKILL)
        holder.wait(30)
        codes = [p.wait(120) for p in standbys]
        for p in standbys:
            p.communicate()
        hold.unlink()
        found = starts(stamp, day)
        succeeded = pg.query(
            "SELECT count(*) FROM ops_jobrun WHERE logical_date = %s AND outcome = 'succeeded'",
            (day,),
        )[0][0]
        if len(found) != 2 or codes != [0, 0] or succeeded != 1:
            ok = False
            print(f"  {day}: starts {found}, exit codes {codes}, successes {succeeded}")
            continue
        times.append(found[1][1] - killed)
    limit = 3 * heartbeat + 5
    shown = ", ".join(f"{t:.1f}" for t in times)
    print(f"heartbeat {heartbeat:g} s: kill to the standby's job start: {shown} s")
    worst = max(times) if times else float("inf")
    goal(
        "F9",
        f"takeover after the holder's SIGKILL, heartbeat {heartbeat:g} s: median "
        f"{statistics.median(times) if times else float('nan'):.1f} s, max {worst:.1f} s over "
        f"{len(times)} trials (goal <= 3 heartbeats + 5 s = {limit:g} s; one success per slot)",
        ok and worst <= limit,
    )


def fires(servers, pg, stamp: Path, count: int) -> None:
    executions, bad_codes, outcomes = [], [], {}
    began = time.monotonic()
    for i in range(count):
        day = f"2002-{1 + i // 28:02d}-{1 + i % 28:02d}"
        procs = [s.start(day, OPS_HEARTBEAT_SECONDS=1, BENCH_STAMP=stamp) for s in servers]
        codes = [p.wait(120) for p in procs]
        for p in procs:
            p.communicate()
        executions.append(len(starts(stamp, day)))
        if codes != [0, 0, 0]:
            bad_codes.append((day, codes))
    for outcome, n in pg.query(
        "SELECT outcome, count(*) FROM ops_jobrun WHERE logical_date >= '2002-01-01' "
        "GROUP BY outcome ORDER BY outcome"
    ):
        outcomes[outcome] = n
    done_on = pg.query(
        "SELECT count(*) FROM ops_jobrun WHERE logical_date >= '2002-01-01' "
        "AND note LIKE 'done on host-%%'"
    )[0][0]
    # A server that starts after the holder has finished finds "already done" instead.
    print(
        f"{count} slots fired on 3 servers at once in {time.monotonic() - began:.0f} s: "
        f"executions per slot {sorted(set(executions))}; history {outcomes}; "
        f"of the skips, {done_on} 'done on <host>' after standing by, the others 'already "
        f"done'; runs not exiting 0: {bad_codes[:5]}"
    )
    goal(
        "F9",
        f"{count} slots x 3 servers: slots executed exactly once "
        f"{executions.count(1)}/{count}, every run exit 0: {not bad_codes}",
        executions == [1] * count
        and not bad_codes
        and outcomes == {"skipped": 2 * count, "succeeded": count},
    )


class BlackHole:
    """A TCP server in the root namespace that accepts connections and never answers: every
    ping to it takes the ping budget."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]

    def close(self):
        self.sock.close()


def tails(servers, pg, stamp: Path, count: int, seed: int) -> None:
    """Each slot's holder ends with random tails; the standbys must not run it again."""
    rng = random.Random(seed)
    hold = Path(tempfile.mkdtemp(prefix="cronops-f9-")) / "hold"
    blackhole = BlackHole()
    bad, seen, tail_seconds = [], dict.fromkeys(TAILS, 0), []
    try:
        for i in range(count):
            day = f"2004-{1 + i // 28:02d}-{1 + i % 28:02d}"
            chosen = [t for t in TAILS if rng.random() < 0.5] or [rng.choice(TAILS)]
            for t in chosen:
                seen[t] += 1
            beat = {"OPS_HEARTBEAT_SECONDS": 1, "BENCH_STAMP": stamp}
            holder_env = {"HOLD": hold, **beat}
            if "leftover" in chosen:
                holder_env["BENCH_LEAVE"] = 1
            if "stalled reader" in chosen:
                holder_env["BENCH_FLOOD"] = 1_000_000
            if "retry wait" in chosen:
                holder_env["BENCH_FAIL_FIRST"] = 1
            if "slow pings" in chosen:
                for env_ in (holder_env, beat):
                    env_["HEALTHCHECKS_PING_URL"] = f"http://{{addr}}:{blackhole.port}/"
                    env_["HEALTHCHECKS_PING_KEY"] = "f9-" + "k" * 20

            def at(server, values):  # the black hole as each host reaches the root namespace
                return {
                    k: str(v).replace("{addr}", server.host.root_address) for k, v in values.items()
                }

            hold.touch()
            holder = servers[0].start(day, "bench-tail", **at(servers[0], holder_env))
            wait_until(lambda d=day: len(starts(stamp, d)) - len(starts(stamp, d, "fail")) == 1, 60)
            standbys = [s.start(day, "bench-tail", **at(s, beat)) for s in servers[1:]]
            time.sleep(2.0)  # they stand by behind the live holder (a bench, not a test)
            hold.unlink()

            def claim_state(d=day):
                rows = pg.query(
                    "SELECT state FROM ops_slotclaim WHERE job = 'bench-tail' "
                    "AND logical_date = %s",
                    (d,),
                )
                return rows[0][0] if rows else None

            # The stalled reader: nothing is read from the holder until its outcome is recorded.
            recorded = wait_until(lambda: claim_state() not in (None, "running"), 120)
            holder_out = holder.communicate(timeout=120)
            results = [(p.wait(120), *p.communicate()) for p in standbys]
            executed = len(starts(stamp, day)) - len(starts(stamp, day, "fail"))
            ended = starts(stamp, day, "end")
            outcomes = sorted(
                r[0]
                for r in pg.query(
                    "SELECT outcome FROM ops_jobrun WHERE job = 'bench-tail' AND logical_date = %s",
                    (day,),
                )
            )
            finished = pg.query(
                "SELECT extract(epoch FROM max(finished_at)) FROM ops_jobrun WHERE job = "
                "'bench-tail' AND logical_date = %s AND outcome = 'succeeded'",
                (day,),
            )[0][0]
            if ended and finished is not None:
                tail_seconds.append(float(finished) - ended[-1][1])
            expected = ["skipped", "skipped", "succeeded"]
            if "retry wait" in chosen:
                expected = ["failed", *expected]
            ok = (
                recorded
                and executed == 1
                and holder.returncode == 0
                and [r[0] for r in results] == [0, 0]
                and all("done on " in r[1] for r in results)
                and outcomes == sorted(expected)
                and claim_state() == "succeeded"
            )
            if not ok:
                bad.append(day)
                print(
                    f"  {day} {chosen}: executed {executed}, holder exit {holder.returncode} "
                    f"({holder_out[1][-300:]!r}), standbys {[r[0] for r in results]} "
                    f"{[r[1][-200:] for r in results]}, history {outcomes}"
                )
    finally:
        blackhole.close()
    shown = ", ".join(f"{t}: {n}" for t, n in seen.items())
    print(
        f"{count} slots with random tails (seed {seed}; {shown}): the holder's tail from its "
        f"job's end to its record {min(tail_seconds, default=0):.1f}-"
        f"{max(tail_seconds, default=0):.1f} s (a heartbeat is stale after 3 s)"
    )
    goal(
        "F9",
        f"{count} slots whose holder ends with random tails, 2 standbys, heartbeat 1 s: "
        f"executed once and the standbys exit 0 in {count - len(bad)}/{count}",
        not bad,
    )


def stats(pg) -> PgDatabase:
    """The server's own database: our reads of the statistics count nowhere in pg.name's."""
    other = PgDatabase.__new__(PgDatabase)
    other.url, other.name = pg.server_url, pg.name
    return other


def xacts(pg) -> int:
    return stats(pg).query(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (pg.name,)
    )[0][0]


def connections(pg) -> int:
    return stats(pg).query(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
        (pg.name,),
    )[0][0]


def rates(pg, counted, window: float) -> tuple[float, float]:
    """(transactions/s of the database, statements/s through `counted`) over `window`."""
    before, sent, started = xacts(pg), counted.queries(), time.monotonic()
    time.sleep(window)
    seconds = time.monotonic() - started
    return (xacts(pg) - before) / seconds, (counted.queries() - sent) / seconds


def load(servers, pg, stamp: Path, window: float, heartbeat: float, counts, day0: int) -> None:
    hold = Path(tempfile.mkdtemp(prefix="cronops-f9-")) / "hold"
    poll = min(5.0, max(0.2, heartbeat))
    for n, standbys_n in enumerate(counts):
        day = f"2003-01-{day0 + n:02d}"
        hold.touch()
        beat = {"OPS_HEARTBEAT_SECONDS": heartbeat, "BENCH_STAMP": stamp}
        holder = servers[0].start(day, HOLD=hold, **beat)
        wait_until(lambda d=day: len(starts(stamp, d)) == 1, 60)
        time.sleep(2)
        counted = next(iter(servers[1].host.forwarders.values()))
        alone, _ = rates(pg, counted, window)  # the holder's heartbeat, autovacuum
        base = connections(pg)
        # all on one server (each with a lock directory of its own): its forwarder counts them
        standbys = [
            servers[1].start(
                day, OPS_LOCK_DIR=f"/tmp/cronops-f9-lock-{os.getpid()}-{n}-{i}", **beat
            )
            for i in range(standbys_n)
        ]
        wait_until(lambda b=base, k=standbys_n: connections(pg) >= b + k, 120)
        time.sleep(2 * poll)
        together, sent = rates(pg, counted, window)
        per_standby = sent / standbys_n
        per_xact = (together - alone) / standbys_n
        hold.unlink()
        codes = [p.wait(120) for p in [holder, *standbys]]
        for p in [holder, *standbys]:
            p.communicate()
        print(
            f"heartbeat {heartbeat:g} s (poll every {poll:g} s), {standbys_n} standby(s) for "
            f"{window:g} s: {sent:.2f} statements/s sent by them ({per_standby:.3f}/s each); "
            f"the database's transactions {together:.2f}/s with them, {alone:.2f}/s without "
            f"({per_xact:.3f}/s each); exit codes {codes}"
        )
        goal(
            "F9",
            f"database load of {standbys_n} waiting standby(s), heartbeat {heartbeat:g} s: "
            f"{per_standby:.3f} statements/s each (goal <= one read per poll, "
            f"{1 / poll:.2f}/s, +10%)",
            per_standby <= 1.1 / poll and set(codes) == {0},
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fires", type=int, default=100)
    parser.add_argument("--tails", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--parts", default="takeover,fires,tails,load")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.quick:
        args.fires, args.trials, args.window, args.tails = 10, 1, 15.0, 6
    reason = available()
    server_url = pg_url()
    if reason or not server_url:
        goal("F9", f"cannot run: {reason or 'PostgreSQL not available (.ci/services.sh)'}", False)
        return 1
    if not parts <= {"takeover", "fires", "tails", "load"}:
        parser.error(f"--parts: takeover, fires, tails, load (not {args.parts!r})")
    pg = PgDatabase(server_url)
    network = Network()
    try:
        db = urllib.parse.urlsplit(pg.url)
        servers = []
        for _ in range(3):
            host = network.add_host()
            address, port = host.forward(db.hostname, db.port)
            url = pg.url.replace(db.netloc, f"{db.username}@{address}:{port}")
            root = deployed_copy(
                CRON,
                env_lines=f"DATABASE_URL={url}\nOPS_HOST={host.name}\n",
                commands={"bench_slot": SLOT},
            )
            # the host's own .env (deployed_copy's starts with OPS_HOST=bench)
            (root / ".env").write_text(
                f"SECRET_KEY=bench\nOPS_HOST={host.name}\nDATABASE_URL={url}\n"
            )
            servers.append(Server(host, root))
        stamp = Path(tempfile.mkdtemp(prefix="cronops-f9-")) / "stamp"
        if "takeover" in parts:
            for i, heartbeat in enumerate((1.0, 3.0)):
                takeover(servers, pg, stamp, heartbeat, args.trials, 1 + 10 * i)
        if "fires" in parts:
            fires(servers, pg, stamp, args.fires)
        if "tails" in parts:
            seed = args.seed if args.seed is not None else random.randrange(10**6)
            tails(servers, pg, stamp, args.tails, seed)
        if "load" in parts:
            counts = (1, 5) if args.quick else (1, 5, 10)
            load(servers, pg, stamp, args.window, 30.0, counts, 1)
            load(servers, pg, stamp, args.window, 1.0, (5,), 11)
    finally:
        network.close()
        pg.drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
