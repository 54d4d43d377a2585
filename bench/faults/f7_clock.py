"""F7: clock changes. DST spring and autumn in Europe/Berlin, the clock stepped back an hour and
stepped forward an hour: every slot a job is fired for runs once, none twice, none lost.

Two ways of firing the jobs:

- **The real Debian cron daemon** under libfaketime (as root, with Debian's `faketime` package
  and unshare(1)): a private `cron -f` in its own mount and pid namespace (tmpfs over /run, the
  spool and /etc/cron.d, an empty /etc/crontab over the host's, so it never meets the host's
  crontabs nor the host's its), its clock started just before the DST night and sped up
  (`x20` by default: a cron minute in 3 s). The crontab carries LD_PRELOAD, FAKETIME,
  FAKETIME_DONT_RESET, FAKETIME_SHARED and TZ as variable lines, so each job run shares the
  daemon's fake clock. Each cron line logs its fire time, then runs `manage.py run_job`.
- **A model of the daemon** (cron.c, 3.0pl1: ops/schedule/firing.py, which the dispatcher
  `run_due_jobs` uses), driving the runner in this process under
  time-machine: each minute it compares the wall clock with its "virtual" minute; +1: run every
  job due; +2..+5: every job for each missed minute; +6 min..+3 h (DST spring, a clock set
  forward): fixed-time jobs for each skipped minute, wildcard jobs (minute or hour field starting
  with `*`) once at the new time; -3 h..0 (DST autumn, a clock set back): wildcard jobs only,
  fixed-time jobs wait until the wall clock passes the virtual minute again. The clock steps
  use only the model; the DST nights use both when the real daemon can run.

The warm dispatcher (`manage.py run_due_jobs`, issue 33) is held to the per-job lines: each
real night runs twice, once with a cron line per job, once with the one `* * * * *` line that
`install_crontab --dispatcher` writes (the dispatcher forks each due job's run_job); in each
pass every job's starts are taken to the minute (the per-job lines': the fire time each line
logs; the dispatcher's: each run_job's first history row, one per process), and the two
passes must start every job in the same minutes. The four model scenarios are also run through
the dispatcher (its due jobs at each of the model's wake-ups, cron's virtual minute kept in its
state file between them, ops/run/virtual_minute.py): the same starts as the model daemon, DST
nights and clocks stepped by hand alike.

Expected slots are every fire instant of each schedule in the window (cronsim), keyed as the
runner keys them (ops/schedule/slots.py): a wildcard job's two 02:30s of the autumn night are
two slots, a fixed-time job has one; a clock stepped back meets slots it already had.
A run serves the slot current at its own start, so under the real daemon a job must start within
the fake minute: at x20 that is 3 s of real time; the output shows the start lags (fake seconds).
On a slow machine use --speed 10.
Usage: python bench/faults/f7_clock.py [--speed 20] [--model-only] [--lines per-job|dispatcher|both]
"""

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from zoneinfo import ZoneInfo

import _path  # noqa: F401
from _common import STAMP, deployed_copy, goal

TZ = ZoneInfo("Europe/Berlin")
UTC = dt.UTC
CRON = """\
* * * * *      --quiet --no-ping --catch-up=70 --name=minutely bench_stamp
*/15 * * * *   --quiet --no-ping --catch-up=8 --name=quarter bench_stamp
0 * * * *      --quiet --no-ping --catch-up=3 --name=hourly bench_stamp
30 2 * * *     --quiet --no-ping --catch-up=2 --name=at0230 bench_stamp
0 3 * * *      --quiet --no-ping --catch-up=2 --name=at0300 bench_stamp
"""
JOBS = {}
for line in CRON.splitlines():
    fields = line.split()
    JOBS[fields[8].removeprefix("--name=")] = " ".join(fields[:5])
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def cron_fires(clock: list[dt.datetime]) -> list[tuple[dt.datetime, str]]:
    """(instant the modelled daemon starts the job, job) for per-minute clock readings: the
    model of ops/schedule/firing.py, which the dispatcher (run_due_jobs) uses too."""
    from ops.schedule.firing import Daemon, Expr

    daemon = Daemon({job: Expr(expr) for job, expr in JOBS.items()})
    fires = []
    for now in clock:
        # One start per job per wake-up (several missed minutes of one job start together
        # and the later ones meet the lock; running them in a row here is no weaker).
        for job in daemon.wake(now.astimezone(TZ)):
            fires.append((now + dt.timedelta(seconds=2), job))
    return fires


def dispatcher_fires(clock: list[dt.datetime]) -> list[tuple[dt.datetime, str]]:
    """(instant, job) the dispatcher starts, woken by cron at each clock reading (one a real
    minute): ops.run.dispatch.due_jobs with its state file, cron's virtual minute kept between
    minutes (ops/run/virtual_minute.py), in a directory of its own."""
    import tempfile

    from ops.run.virtual_minute import VirtualMinute
    from ops.schedule.firing import Expr

    exprs = {job: Expr(expr) for job, expr in JOBS.items()}
    fires = []
    with tempfile.TemporaryDirectory() as directory:
        real = [0.0]  # the monotonic clock: a minute a reading, whatever the clock says
        memory = VirtualMinute(
            Path(directory) / "run_due_jobs.state", print, boot="f7", monotonic=lambda: real[0]
        )
        for i, now in enumerate(clock):
            real[0] = 60.0 * i
            fires += [
                (now + dt.timedelta(seconds=2), job)
                for job in memory.due(exprs, TZ, now + dt.timedelta(seconds=1))
            ]
    return fires


def start_minutes(fires) -> dict[str, Counter]:
    """{job: Counter of the UTC minutes it was started in} from (instant, job) pairs."""
    out = {job: Counter() for job in JOBS}
    for at, job in fires:
        out[job][at.astimezone(UTC).replace(second=0, microsecond=0)] += 1
    return out


def differences(a: dict[str, Counter], b: dict[str, Counter]) -> dict[str, tuple[list, list]]:
    """{job: (minutes only in a, minutes only in b)} for the jobs whose starts differ."""
    out = {}
    for job in JOBS:
        only_a, only_b = a[job] - b[job], b[job] - a[job]
        if only_a or only_b:
            out[job] = (sorted(only_a.elements()), sorted(only_b.elements()))
    return out


def local(minute: dt.datetime) -> str:
    return f"{minute.astimezone(TZ):%H:%M %Z}"


def expected_slots(first: dt.datetime, last: dt.datetime) -> dict[str, set[str]]:
    """Every fire instant of each job in [first, last], keyed as the runner keys slots."""
    from cronsim import CronSim

    from ops.schedule.slots import make_slot

    out = {}
    for job, expr in JOBS.items():
        keys = set()
        start = (first.astimezone(UTC) - dt.timedelta(minutes=1)).astimezone(TZ)
        for fire in CronSim(expr, start):
            if fire.astimezone(UTC) > last:
                break
            keys.add(make_slot(expr, fire).key)
        out[job] = keys
    return out


def minutes(start: dt.datetime, count: int, step_at: int | None = None, step: int = 0):
    """Per-minute clock readings; from minute `step_at` on, the clock is off by `step` min."""
    return [
        start + dt.timedelta(minutes=i + (step if step_at is not None and i >= step_at else 0))
        for i in range(count)
    ]


def report(name, fires_per_job, first, last, label):
    """Compare the history with the expected slots; print one goal line."""
    from ops.models import JobRun

    in_window = JobRun.objects.filter(scheduled_at__gte=first, scheduled_at__lte=last)
    expected = expected_slots(first, last)
    ran = Counter(in_window.filter(outcome="succeeded").values_list("job", "slot").iterator())
    skips = Counter(
        in_window.filter(outcome="skipped", note__startswith="already done").values_list(
            "job", flat=True
        )
    )
    others = Counter(in_window.exclude(outcome__in=["succeeded", "skipped"]).values_list("outcome"))
    twice = {k: n for k, n in ran.items() if n > 1}
    lost = {(j, s) for j, keys in expected.items() for s in keys if (j, s) not in ran}
    extra = {k for k in ran if k[1] not in expected.get(k[0], set())}
    fired = sum(fires_per_job.values())
    lags = sorted(in_window.filter(outcome="succeeded").values_list("lag", flat=True))
    print(
        f"{name} [{label}]: cron fired {fired} runs, {sum(ran.values())} executions for "
        f"{sum(map(len, expected.values()))} expected slots, {sum(skips.values())} "
        f"'already done' skips, other outcomes {dict(others) or 'none'}; start lag "
        f"median {lags[len(lags) // 2]:.1f} s, max {lags[-1]:.1f} s (catch-up runs included)"
    )
    for job, expr in JOBS.items():
        done = sum(n for (j, _), n in ran.items() if j == job)
        print(
            f"    {job:9} {expr:13} fired {fires_per_job.get(job, 0):3}, executed {done:3}, "
            f"expected {len(expected[job]):3}, already done {skips.get(job, 0):3}"
        )
    if twice or lost or extra:
        print(f"    twice {sorted(twice)[:5]} lost {sorted(lost)[:5]} extra {sorted(extra)[:5]}")
    return goal(
        "F7",
        f"{name} [{label}]: {fired} fires, {sum(ran.values())} executions for "
        f"{sum(map(len, expected.values()))} slots; run twice {len(twice)}, lost {len(lost)}, "
        f"unexpected {len(extra)}",
        not twice and not lost and not extra and not others,
    )


def model_scenarios() -> None:
    import time_machine

    from ops.models import JobRun, SlotClaim
    from ops.run import runner

    start = {
        "spring": dt.datetime(2026, 3, 28, 23, 0, tzinfo=UTC),
        "autumn": dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC),
        "back": dt.datetime(2026, 6, 9, 22, 0, tzinfo=UTC),
        "forward": dt.datetime(2026, 6, 10, 22, 0, tzinfo=UTC),
    }
    scenarios = {
        # 00:00-04:00 local; 02:00 CET jumps to 03:00 CEST
        "DST spring (Berlin, 2026-03-29)": minutes(start["spring"], 240),
        # 00:00-05:00 local; 03:00 CEST falls back to 02:00 CET
        "DST autumn (Berlin, 2026-10-25)": minutes(start["autumn"], 360),
        # 00:00 local on; at 03:10 the clock is stepped back an hour (to 02:10)
        "clock stepped back 1 h": minutes(start["back"], 360, 190, -60),
        # 00:00 local on; at 02:10 the clock is stepped forward an hour (to 03:10)
        "clock stepped forward 1 h": minutes(start["forward"], 300, 130, 60),
    }
    for name, clock in scenarios.items():
        JobRun.objects.all().delete()
        SlotClaim.objects.all().delete()
        fires = cron_fires(clock)
        codes = Counter()
        for at, job in fires:
            with time_machine.travel(at, tick=False):
                codes[runner.run([job])] += 1
        if set(codes) != {0}:
            print(f"    exit codes {dict(codes)}")
        report(name, Counter(j for _, j in fires), clock[0], max(clock), "model, in-process")
        # The dispatcher's answer at each of the same wake-ups.
        diff = differences(start_minutes(fires), start_minutes(dispatcher_fires(clock)))
        said = "; ".join(
            f"{job}: cron only {[local(m) for m in a]}, dispatcher only {[local(m) for m in b]}"
            for job, (a, b) in diff.items()
        )
        goal(
            "F7",
            f"{name} [the dispatcher (run_due_jobs, its virtual minute kept) vs the model "
            f"daemon]: {len(JOBS) - len(diff)} of {len(JOBS)} jobs started in the same minutes",
            not diff,
        )
        if diff:
            print(f"    {said}")


# --kill-child: a night whose unshare is killed (a timeout) takes its cron and jobs with it,
# instead of firing on at x20 beside the next night.
NAMESPACES = [
    "unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
    "--propagation", "private",
]  # fmt: skip
INNER = r"""
set -eu
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o "mode=1730,gid=$CRONTAB_GID" tmpfs /var/spool/cron/crontabs
mount -t tmpfs tmpfs /etc/cron.d
# libfaketime's semaphore and clock, named after the wrapper's pid (the same small pid in every
# new pid namespace): private, so that a night killed halfway leaves none to refuse the next.
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount --bind "$ROOT/empty" /etc/crontab
export TZ=Europe/Berlin
faketime -f "@$START x$SPEED" /usr/sbin/cron -f &
for _ in $(seq 100); do cron=$(pgrep -x cron || true); [ -n "$cron" ] && break; sleep 0.05; done
shared=$(tr '\0' '\n' < "/proc/$cron/environ" | grep '^FAKETIME_SHARED=')
{
  echo "LD_PRELOAD=$LIBFAKETIME"
  echo "FAKETIME=@$START x$SPEED"
  echo "FAKETIME_DONT_RESET=1"
  echo "$shared"
  echo "TZ=Europe/Berlin"
  cat "$ROOT/jobs.cron"
} > /var/spool/cron/crontabs/root
chmod 600 /var/spool/cron/crontabs/root
touch /var/spool/cron/crontabs
sleep "$SECONDS_TO_RUN"
kill "$cron"
# Let the runs cron started finish: leaving this pid namespace would kill them.
# (the dispatcher's run_jobs are forks of `manage.py run_due_jobs`: their command line)
for _ in $(seq 600); do pgrep -f 'manage.py run_' > /dev/null || break; sleep 0.1; done
"""


def real_cron_available() -> str:
    """'' when the real daemon can be driven here; else why not."""
    if os.geteuid() != 0:
        return "needs root (a private cron daemon in a mount namespace)"
    for tool in ("faketime", "unshare", "pgrep"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt install faketime util-linux procps)"
    if not LIBFAKETIME.exists() or not Path("/usr/sbin/cron").exists():
        return "Debian's cron and libfaketime (apt install cron faketime) are needed"
    return ""


def run_starts(first, last) -> dict[str, Counter]:
    """{job: Counter of UTC minutes} in which a run_job of it started: each process's first
    history row (catch-up rows share its pid), whoever started it."""
    from django.db.models import Min

    from ops.models import JobRun

    out = {job: Counter() for job in JOBS}
    rows = JobRun.objects.values("job", "pid").annotate(at=Min("started_at"))
    for row in rows:
        minute = row["at"].astimezone(UTC).replace(second=0, microsecond=0)
        if first <= minute <= last and row["job"] in out:
            out[row["job"]][minute] += 1
    return out


def dispatcher_crontab(root: Path) -> str:
    """The block `install_crontab --dispatcher` writes, as it writes it (to a file)."""
    tab = root / "dispatcher.tab"
    tab.write_text("")
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "install_crontab",
            "--dispatcher",
            "--allow-tz-mismatch",
            f"--tabfile={tab}",
        ],
        cwd=root,
        env=dict(os.environ, TZ="Europe/Berlin"),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"install_crontab --dispatcher failed:\n{done.stdout}{done.stderr}")
    return tab.read_text()


def real_cron_night(
    root: Path, name: str, start: str, first, last, speed: int, dispatcher: bool = False
) -> dict[str, Counter]:
    """Run the private daemon from `start` (local time) until `last` + 1 min, then report;
    return each job's start minutes (UTC). `dispatcher`: the crontab is the dispatcher's one
    line (install_crontab --dispatcher), not a line per job."""
    import grp

    from ops.models import JobRun, SlotClaim

    JobRun.objects.all().delete()
    SlotClaim.objects.all().delete()
    fires_log = root / "fires.log"
    fires_log.unlink(missing_ok=True)
    (root / "empty").write_text("")
    if dispatcher:
        # Beside it, a wildcard line of the same schedule logs each of cron's starts of it.
        text = dispatcher_crontab(root) + (
            f'* * * * * echo "$(date +\\%s) dispatcher" >> {fires_log}\n'
        )
    else:
        lines = []
        for job, expr in JOBS.items():
            # `%` is a newline in a crontab command: escaped. The fire time is the daemon's
            # clock.
            lines.append(
                f'{expr} cd {root} && echo "$(date +\\%s) {job}" >> {fires_log}; '
                f"{sys.executable} manage.py run_job {job} >> {root}/run.log 2>&1"
            )
        text = "\n".join(lines) + "\n"
    (root / "jobs.cron").write_text(text)
    begin = dt.datetime.fromisoformat(start).replace(tzinfo=TZ).astimezone(UTC)
    fake_seconds = (last - begin).total_seconds() + 60
    env = dict(
        os.environ,
        ROOT=str(root),
        START=start,
        SPEED=str(speed),
        LIBFAKETIME=str(LIBFAKETIME),
        CRONTAB_GID=str(grp.getgrnam("crontab").gr_gid),
        SECONDS_TO_RUN=f"{fake_seconds / speed:.1f}",
    )
    how = "the dispatcher's line" if dispatcher else "a line per job"
    print(
        f"{name}: real cron under libfaketime x{speed}, {how}, {fake_seconds / speed:.0f} s",
        flush=True,
    )
    subprocess.run(
        [*NAMESPACES, "bash", "-c", INNER],
        env=env,
        check=True,
        timeout=fake_seconds / speed + 180,
    )
    cron_fires = Counter()
    by_cron = {job: Counter() for job in [*JOBS, "dispatcher"]}
    for line in fires_log.read_text().splitlines():
        stamp, job = line.split()
        at = dt.datetime.fromtimestamp(int(stamp) // 60 * 60, UTC)
        if first <= at <= last:
            cron_fires[job] += 1
            by_cron[job][at] += 1
    started = run_starts(first, last)
    if dispatcher:
        fires = Counter({job: sum(c.values()) for job, c in started.items()})
        label = f"real Debian cron, the dispatcher's line, libfaketime x{speed}"
        print(
            f"    cron started the dispatcher's line {cron_fires['dispatcher']} times "
            f"(one a minute: {len(by_cron['dispatcher'])} distinct minutes)"
        )
    else:
        fires = cron_fires
        label = f"real Debian cron, libfaketime x{speed}"
        # The history's starts, as the dispatcher's pass reads them, against cron's own log.
        if differences({j: by_cron[j] for j in JOBS}, started):
            print(f"    run_job starts differ from cron's fires: {differences(by_cron, started)}")
    report(name, fires, first, last, label)
    return {job: by_cron[job] for job in JOBS} if not dispatcher else started


def compare_passes(name: str, per_job: dict[str, Counter], dispatched: dict[str, Counter]):
    diff = differences(per_job, dispatched)
    for job, expr in JOBS.items():
        print(
            f"    {job:9} {expr:13} per-job line fired in {sum(per_job[job].values()):3} "
            f"minutes, the dispatcher started it in {sum(dispatched[job].values()):3}"
            + (
                f": per-job only {[local(m) for m in diff[job][0]]}, dispatcher only "
                f"{[local(m) for m in diff[job][1]]}"
                if job in diff
                else ", the same minutes"
            )
        )
    return goal(
        "F7",
        f"{name} [the dispatcher's line vs the per-job lines, real Debian cron]: "
        f"{len(JOBS) - len(diff)} of {len(JOBS)} jobs started in the same minutes "
        f"({sum(sum(c.values()) for c in dispatched.values())} starts vs "
        f"{sum(sum(c.values()) for c in per_job.values())} fires)",
        not diff,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speed", type=int, default=20, help="libfaketime speed-up")
    parser.add_argument("--model-only", action="store_true")
    parser.add_argument(
        "--lines",
        choices=["per-job", "dispatcher", "both"],
        default="both",
        help="the real nights' crontab: a line per job, the dispatcher's line, or each in turn",
    )
    args = parser.parse_args()
    root = deployed_copy(
        CRON, commands={"bench_stamp": STAMP}, env_lines="TIME_ZONE=Europe/Berlin\n"
    )
    os.chdir(root)
    sys.path.insert(0, str(root))
    os.environ.update(TIME_ZONE="Europe/Berlin", DJANGO_SETTINGS_MODULE="config.settings")
    os.environ.pop("BENCH_STAMP", None)
    import django

    django.setup()
    import ops

    print(f"F7: ops from {Path(ops.__file__).parent} (the deployed copy)", flush=True)
    model_scenarios()
    why_not = "--model-only" if args.model_only else real_cron_available()
    if why_not:
        print(f"F7: the real cron daemon was not driven: {why_not}")
        return 0
    nights = [
        # 01:50 CEST to 03:10 CET: the repeated hour, both 02:30s, the 03:00 job
        (
            "DST autumn night (Berlin, 2026-10-25 01:50 CEST-03:10 CET)",
            "2026-10-25 01:46:00",
            dt.datetime(2026, 10, 24, 23, 50, tzinfo=UTC),
            dt.datetime(2026, 10, 25, 2, 10, tzinfo=UTC),
        ),
        # 01:50 CET to 03:10 CEST: 02:00 CET jumps to 03:00 CEST
        (
            "DST spring night (Berlin, 2026-03-29 01:50 CET-03:10 CEST)",
            "2026-03-29 01:46:00",
            dt.datetime(2026, 3, 29, 0, 50, tzinfo=UTC),
            dt.datetime(2026, 3, 29, 1, 10, tzinfo=UTC),
        ),
    ]
    for name, start, first, last in nights:
        per_job = dispatched = None
        if args.lines in ("per-job", "both"):
            per_job = real_cron_night(root, name, start, first, last, args.speed)
        if args.lines in ("dispatcher", "both"):
            dispatched = real_cron_night(root, name, start, first, last, args.speed, True)
        if per_job is not None and dispatched is not None:
            compare_passes(name, per_job, dispatched)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
