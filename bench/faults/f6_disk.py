"""F6: a full disk under the job's log, and an unwritable lock directory.

Cases (the full and read-only file systems are real tmpfs mounts, so this needs root; with no
mount permission it falls back to /dev/full for the log and says so):
  log/full      run_job's stdout and stderr appended to a log on a full 64 KiB tmpfs, as the
                installed cron line does (`>> OPS_LOG_DIR/<job>.log 2>&1`)
  log/devfull   the same into /dev/full (every write fails with ENOSPC)
  lock/ro       OPS_LOCK_DIR on a read-only tmpfs
  lock/missing  OPS_LOCK_DIR inside a read-only tmpfs, not created yet
Must hold: the run does not crash; the log cases keep the job's exit code and record its
history (the output is lost, the record is not); every case gives one clear `cronops:` error
(where it can be read: the history note and the ping body when the log is full) and a /fail
ping; nothing corrupted (SQLite integrity_check, no claim left `running`).
Usage: python bench/faults/f6_disk.py
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _path  # noqa: F401
from _common import FaultServer, deployed_copy, env, goal, sqlite_rows

LOUD = """\
import sys

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Prints 1 MB, then exits with --exit (benchmarks)."

    def add_arguments(self, parser):
        parser.add_argument("--exit", type=int, default=0)

    def handle(self, *args, **options):
        for i in range(13000):
            self.stdout.write(f"line {i:06} " + "x" * 66)
        if options["exit"]:
            raise SystemExit(options["exit"])
"""


def mount(directory: Path, options: str) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], capture_output=True
    )
    return done.returncode == 0


def umount(directory: Path) -> None:
    subprocess.run(["umount", str(directory)], capture_output=True)


def cron_run(root: Path, log: str, extra: dict, *args: str):
    """The installed cron line's shape: `... run_job ARGS >> LOG 2>&1`, through /bin/sh."""
    manage = f"{sys.executable} {root / 'manage.py'}"
    line = f"cd {root} && {manage} run_job {' '.join(args)} >> {log} 2>&1; echo $? >&3"
    r, w = os.pipe()
    proc = subprocess.Popen(
        ["/bin/sh", "-c", line.replace(">&3", f">&{w}")], env=env(**extra), pass_fds=(w,)
    )
    os.close(w)
    proc.wait(timeout=300)
    with os.fdopen(r) as status:
        return int(status.read().strip() or -1)


def last_run(root: Path, job: str):
    rows = sqlite_rows(
        root,
        "SELECT outcome, exit_code, note FROM ops_jobrun WHERE job = ? ORDER BY id DESC LIMIT 1",
        (job,),
    )
    return rows[0] if rows else None


def main() -> int:
    root = deployed_copy(
        "* * * * * --name=loud bench_loud\n* * * * * --name=loud_fail bench_loud --exit=3\n",
        commands={"bench_loud": LOUD},
    )
    work = Path(tempfile.mkdtemp(prefix="cronops-f6-"))
    server = FaultServer("ok")
    pings = {"HEALTHCHECKS_PING_URL": server.url, "HEALTHCHECKS_PING_KEY": "key"}
    full = work / "full"
    have_mounts = os.geteuid() == 0 and mount(full, "size=64k")
    logs = {"log/devfull": "/dev/full"}
    if have_mounts:
        try:
            with open(full / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        logs = {"log/full": str(full / "loud.log"), **logs}
    else:
        print("no tmpfs mounts here (needs root): /dev/full only")
    try:
        for case, log in logs.items():
            for job, expect in (("loud", 0), ("loud_fail", 3)):
                server.log.clear()
                code = cron_run(root, log, pings, "--force", job)
                row = last_run(root, job)
                final = [p for p, _ in server.log if "/start" not in p]
                body = server.log[-1][1].decode(errors="replace") if server.log else ""
                first = body.splitlines()[0] if body else ""
                print(
                    f"{case} {job}: exit {code}; history {row[:2] if row else None} note "
                    f"{row[2] if row else ''!r}; pings {[p.split('?')[0] for p in final]}; "
                    f"ping body starts {first!r}"
                )
                goal(
                    "F6",
                    f"{case} ({job}): exit {code} (job's {expect}), recorded "
                    f"{row[:2] if row else None}, the loss noted and pinged as a failure",
                    code == expect
                    and row is not None
                    and row[1] == expect
                    and "output lost" in (row[2] or "")
                    and first.startswith("cronops: ")
                    and "output lost" in first
                    and len(final) == 1
                    and final[0].split("?")[0].endswith("/fail"),
                )
        if have_mounts:
            ro = work / "ro"
            mount(ro, "size=64k,ro")
            for case, lock_dir in (("lock/ro", ro), ("lock/missing", ro / "lock")):
                server.log.clear()
                done = subprocess.run(
                    [sys.executable, str(root / "manage.py"), "run_job", "loud"],
                    cwd=root,
                    env=env(**pings, OPS_LOCK_DIR=lock_dir),
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                errors = [x for x in done.stderr.splitlines() if x.startswith("cronops: error")]
                paths = [p.split("?")[0] for p, _ in server.log]
                print(f"{case}: exit {done.returncode}; {errors}; pings {paths}")
                goal(
                    "F6",
                    f"{case}: one clear error line, a /fail ping, exit {done.returncode}",
                    done.returncode != 0
                    and len(errors) == 1
                    and "Traceback" not in done.stderr
                    and paths == ["/key/loud/fail"],
                )
            umount(ro)
    finally:
        if have_mounts:
            umount(full)
    server.close()
    integrity = sqlite_rows(root, "PRAGMA integrity_check")[0][0]
    running = sqlite_rows(root, "SELECT COUNT(*) FROM ops_slotclaim WHERE state = 'running'")
    goal(
        "F6",
        f"no corrupted state: integrity_check {integrity}, claims left running {running[0][0]}",
        integrity == "ok" and running[0][0] == 0,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
