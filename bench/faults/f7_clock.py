"""F7: clock changes. DST spring and autumn in Europe/Berlin, the clock stepped back an hour and
stepped forward an hour: no slot runs twice, none is lost (with --catch-up).

The runner runs in this process under time-machine (like tests/test_runner_inprocess.py), fired
at the instants a Debian cron daemon would fire it. The daemon is modelled after cron.c
(3.0pl1): each minute it compares the wall clock with its own "virtual" minute; +1: run every
job due; +2..+5: run every job for each missed minute; +6 min..+3 h (DST spring, a clock set
forward): fixed-time jobs for each skipped minute, wildcard jobs (minute or hour field
starting with `*`) once at the new time; -3 h..0 (DST autumn, a clock set back): wildcard
jobs only, fixed-time jobs wait until the wall clock passes the virtual minute again.
Expected slots are every fire time of each schedule in the window (cronsim, wall-clock keys).
Usage: python bench/faults/f7_clock.py
"""

import datetime as dt
import os
import sys
from collections import Counter
from zoneinfo import ZoneInfo

import _path  # noqa: F401
from _common import STAMP, deployed_copy, goal

TZ = ZoneInfo("Europe/Berlin")
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


def matches(expr: str, wall: dt.datetime) -> bool:
    minute, hour = expr.split()[:2]

    def ok(field, value):
        if field == "*":
            return True
        if field.startswith("*/"):
            return value % int(field[2:]) == 0
        return value == int(field)

    return ok(minute, wall.minute) and ok(hour, wall.hour)


def wildcard(expr: str) -> bool:
    minute, hour = expr.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def cron_fires(clock: list[dt.datetime]) -> list[tuple[dt.datetime, str]]:
    """(instant the daemon starts the job, job) for a list of per-minute clock readings."""
    fires = []
    wall = [c.astimezone(TZ).replace(tzinfo=None) for c in clock]
    virtual = wall[0] - dt.timedelta(minutes=1)
    for now, here in zip(clock, wall, strict=True):
        diff = round((here - virtual).total_seconds() / 60)
        due = []
        if diff == 1:
            due = [(j, here) for j, e in JOBS.items() if matches(e, here)]
            virtual = here
        elif 1 < diff <= 5:
            for k in range(1, diff + 1):
                m = virtual + dt.timedelta(minutes=k)
                due += [(j, m) for j, e in JOBS.items() if matches(e, m)]
            virtual = here
        elif 5 < diff <= 180:
            for k in range(1, diff + 1):
                m = virtual + dt.timedelta(minutes=k)
                due += [(j, m) for j, e in JOBS.items() if not wildcard(e) and matches(e, m)]
            due += [(j, here) for j, e in JOBS.items() if wildcard(e) and matches(e, here)]
            virtual = here
        elif -180 <= diff <= 0:
            due = [(j, here) for j, e in JOBS.items() if wildcard(e) and matches(e, here)]
        else:
            due = [(j, here) for j, e in JOBS.items() if matches(e, here)]
            virtual = here
        # One start per job per wake-up (several missed minutes of one job start together
        # and the later ones meet the lock; running them in a row here is no weaker).
        for job in dict.fromkeys(job for job, _ in due):
            fires.append((now + dt.timedelta(seconds=2), job))
    return fires


def expected_slots(first: dt.datetime, last: dt.datetime) -> dict[str, set[str]]:
    from cronsim import CronSim

    out = {}
    for job, expr in JOBS.items():
        keys = set()
        for fire in CronSim(expr, first.astimezone(TZ) - dt.timedelta(minutes=1)):
            if fire > last.astimezone(TZ):
                break
            keys.add(fire.strftime("%Y-%m-%d %H:%M"))
        out[job] = keys
    return out


def minutes(start: dt.datetime, count: int, step_at: int | None = None, step: int = 0):
    """Per-minute clock readings; from minute `step_at` on, the clock is off by `step` min."""
    return [
        start + dt.timedelta(minutes=i + (step if step_at is not None and i >= step_at else 0))
        for i in range(count)
    ]


def main() -> int:
    root = deployed_copy(CRON, commands={"bench_stamp": STAMP})
    os.chdir(root)
    sys.path.insert(0, str(root))
    os.environ.update(TIME_ZONE="Europe/Berlin", DJANGO_SETTINGS_MODULE="config.settings")
    os.environ.pop("BENCH_STAMP", None)
    import django

    django.setup()
    import time_machine

    from ops import runner
    from ops.models import JobRun, SlotClaim

    utc = dt.UTC
    start = {
        "spring": dt.datetime(2026, 3, 28, 23, 0, tzinfo=utc),
        "autumn": dt.datetime(2026, 10, 24, 22, 0, tzinfo=utc),
        "back": dt.datetime(2026, 6, 9, 22, 0, tzinfo=utc),
        "forward": dt.datetime(2026, 6, 10, 22, 0, tzinfo=utc),
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
        expected = expected_slots(clock[0], max(clock))
        ran = Counter(
            JobRun.objects.filter(outcome="succeeded").values_list("job", "slot").iterator()
        )
        twice = {k: n for k, n in ran.items() if n > 1}
        lost = {(j, s) for j, keys in expected.items() for s in keys if (j, s) not in ran}
        extra = {k for k in ran if k[1] not in expected.get(k[0], set())}
        skipped = JobRun.objects.filter(outcome="skipped").count()
        print(
            f"{name}: cron fired {len(fires)} runs (exit codes {dict(codes)}), "
            f"{sum(ran.values())} executions for {sum(map(len, expected.values()))} expected "
            f"slots, {skipped} 'already done' skips"
        )
        for job in JOBS:
            fired = sum(1 for _, j in fires if j == job)
            done = sum(n for (j, _), n in ran.items() if j == job)
            print(
                f"    {job:9} fired {fired:3}, executed {done:3}, expected {len(expected[job]):3}"
            )
        if twice or lost or extra:
            print(
                f"    twice {sorted(twice)[:5]} lost {sorted(lost)[:5]} extra {sorted(extra)[:5]}"
            )
        goal(
            "F7",
            f"{name}: slots run twice {len(twice)}, lost {len(lost)}, unexpected {len(extra)}",
            not twice and not lost and not extra and set(codes) == {0},
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
