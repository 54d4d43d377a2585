"""Where a run's output goes, and a run that survives whatever the job does to it: real
processes against a deployed copy, like tests/test_runner.py.

- `--log` (what every installed cron line uses): run_job opens the job's log itself, creating
  its directory, so a deleted OPS_LOG_DIR cannot stop a run before it starts;
- a job that closes or fills its own descriptors: the outcome is still recorded, the claim
  released, the final ping sent, and the exit code is the job's.
"""

import datetime as dt
import os
import shlex
import stat
import subprocess

import pytest

from .conftest import DAILY, PING_KEY, add_echo_args, base_env, wait_until
from .test_install import cron_percent, install

GOOD = "0 3 * * * --no-ping echo_args hello log\n"


def installed_command(project, tmp_path, cron: str) -> str:
    """Install `cron` into a tab file and return the command part of its one job line."""
    project.write_cron("10-job.cron", cron)
    tab = tmp_path / "tab"
    result = install(project, "--tabfile", str(tab))
    assert result.returncode == 0, result.stderr
    line = next(x for x in tab.read_text().split("\n") if "run_job" in x)
    return line.split(None, 5)[5]


def as_cron_runs_it(command: str, home) -> subprocess.CompletedProcess:
    """The command the way Debian's cron runs it: /bin/sh -c, a bare environment, cwd $HOME."""
    return subprocess.run(
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            f"HOME={home}",
            "SHELL=/bin/sh",
            "LOGNAME=root",
            "/bin/sh",
            "-c",
            cron_percent(command),
        ],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_installed_line_recreates_a_deleted_log_directory_and_the_run_is_recorded(
    sqlite_project, tmp_path
):
    """With `>> var/log/x.log` the shell failed before run_job started: no history row, no
    ping, no error anywhere. Now run_job opens the log itself."""
    project = sqlite_project
    add_echo_args(project.dir)
    command = installed_command(project, tmp_path, GOOD)
    assert ">>" not in command and "--log=" in command
    var = project.dir / "var"
    assert (var / "log").is_dir()  # install_crontab made it ...
    subprocess.run(["rm", "-rf", str(var)], check=True)  # ... and a cleanup deleted it

    result = as_cron_runs_it(command, tmp_path)

    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")  # nothing for cron to mail
    assert [r[3:5] for r in project.db.runs("echo_args")] == [("succeeded", 0)]
    log_dir = var / "log"
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o750
    log = log_dir / "echo_args.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o640
    assert 'ARGS ["hello", "log"]' in log.read_text()

    again = as_cron_runs_it(command, tmp_path)  # appends, and the runner's lines go there too
    assert again.returncode == 0, again.stderr
    text = log.read_text()
    assert text.count('ARGS ["hello", "log"]') == 1
    assert text.count("cronops: job echo_args: already done for ") == 1


def test_a_log_that_cannot_be_opened_still_runs_the_job_records_why_and_fails_the_ping(
    project, tmp_path, ping_server
):
    """A symlink planted where the log goes (O_NOFOLLOW refuses it): the job runs, its output
    goes to cron's own stdout (its mail), and the history note and the ping say why."""
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY
    )
    add_echo_args(project.dir)
    command = installed_command(project, tmp_path, GOOD.replace("--no-ping ", ""))
    target = tmp_path / "not-the-log"
    target.write_text("untouched\n")
    log = project.dir / "var" / "log" / "echo_args.log"
    log.symlink_to(target)

    result = as_cron_runs_it(command, tmp_path)

    assert result.returncode == 0, result.stderr
    assert 'ARGS ["hello", "log"]' in result.stdout  # to cron's mail instead
    assert result.stderr == (
        f"cronops: error: cannot open the log {log}: it is a symbolic link; output went to "
        "cron's mail\n"
    )
    assert target.read_text() == "untouched\n"
    [(outcome, code, note)] = [r[3:6] for r in project.db.runs("echo_args")]
    assert (outcome, code) == ("succeeded", 0)
    assert f"cannot open the log {log}: it is a symbolic link" in note
    final = ping_server.log[-1][0]
    assert final.path == f"/{PING_KEY}/echo_args/fail"
    assert final.get_data().startswith(b"cronops: cannot open the log ")


def test_a_fifo_planted_as_the_log_does_not_hang_the_run(project, tmp_path):
    """Opened for writing, a FIFO without a reader blocked run_job before the lock: no history,
    no ping, and a new hung process every minute."""
    add_echo_args(project.dir)
    command = installed_command(project, tmp_path, GOOD)
    log = project.dir / "var" / "log" / "echo_args.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(log)

    result = as_cron_runs_it(command, tmp_path)

    assert result.returncode == 0, result.stderr
    assert f"cannot open the log {log}: it is not a regular file" in result.stderr
    assert [r[3:5] for r in project.db.runs("echo_args")] == [("succeeded", 0)]


@pytest.mark.parametrize("closed", ["<&- >&-", ">&- 2>&-", "<&- >&- 2>&-"])
def test_a_run_started_with_stdout_closed_records_the_jobs_own_outcome(sqlite_project, closed):
    """Python sets sys.stdout to None when fd 1 is closed at start: the job's
    self.stdout.write failed after its work was done, recorded failed, and so ran again."""
    project = sqlite_project
    project.add_command("t_says", "self.stdout.write('charged'); self.stderr.write('note')")
    project.write_cron("t.cron", f"{DAILY} --no-ping t_says\n")
    command = " ".join(shlex.quote(w) for w in project.command("run_job", "t_says"))
    result = subprocess.run(
        f"{command} {closed}", shell=True, cwd=project.dir, env=base_env(), timeout=120
    )
    assert result.returncode == 0
    assert [r[3:5] for r in project.db.runs("t_says")] == [("succeeded", 0)]


def test_a_usage_error_on_an_installed_line_lands_in_its_log(sqlite_project, tmp_path):
    project = sqlite_project
    log = project.dir / "var" / "log" / "x.log"

    result = project.run_job(f"--log={log}", "--timeout=soon", "check")

    assert result.returncode == 2
    assert (result.stdout, result.stderr) == ("", "")
    assert log.read_text().startswith("cronops: error: ")
    assert project.db.runs() == []


# --- a job that closes or fills its own descriptors ------------------------------------------

CLOSERS = {
    "closes fds 1 and 2, then prints": ("os.close(1); os.close(2); print('x')", 0),
    "closes fds 1 and 2, then fails": (
        "os.close(1); os.close(2); print('x'); raise CommandError('broken', returncode=3)",
        3,
    ),
    "closes sys.stderr, then raises": ("sys.stderr.close(); raise ValueError('boom')", 1),
    "closes sys.stdout, then fails": (
        "sys.stdout.close(); raise CommandError('broken', returncode=4)",
        4,
    ),
    "closes both streams, then returns": ("sys.stdout.close(); sys.stderr.close()", 0),
    "leaves fds 1 and 2 on /dev/full with unflushed output": (
        "full = os.open('/dev/full', os.O_WRONLY); os.dup2(full, 1); os.dup2(full, 2); "
        "sys.stdout.write('pending'); sys.stderr.write('pending')",
        0,
    ),
}


def run_with_output(project, where: str, *args) -> tuple[int, str]:
    """run_job ARGS with stdout and stderr on `where`: a pipe we read, /dev/full, or a pipe
    whose reader is gone (EPIPE). Returns (exit code, what was read)."""
    command, env = project.command("run_job", *args), base_env()
    if where == "a pipe":
        result = subprocess.run(
            command, cwd=project.dir, env=env, capture_output=True, text=True, timeout=120
        )
        return result.returncode, result.stdout + result.stderr
    if where == "/dev/full":
        with open("/dev/full", "wb") as full:
            result = subprocess.run(
                command, cwd=project.dir, env=env, stdout=full, stderr=full, timeout=120
            )
        return result.returncode, ""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            command, cwd=project.dir, env=env, stdout=write_end, stderr=write_end, timeout=120
        )
    finally:
        os.close(write_end)
    return result.returncode, ""


def expect_recorded(project, ping_server, job: str, code: int, where: str) -> None:
    outcome = "succeeded" if code == 0 else "failed"
    assert [r[3:5] for r in project.db.runs(job)] == [(outcome, code)]
    assert project.db.query("SELECT state FROM ops_slotclaim WHERE job = ?", (job,)) == [(outcome,)]
    paths = [req.path for req, _ in ping_server.log]
    assert paths[0] == f"/{PING_KEY}/{job}/start"
    final = f"/{PING_KEY}/{job}" + (f"/{code}" if code else "")
    if where == "a pipe":
        assert paths[1:] == [final]
    else:  # output that could not be written makes it /fail (README, "Outcomes")
        assert len(paths) == 2 and paths[1] in (final, f"/{PING_KEY}/{job}/fail")


@pytest.mark.parametrize("body", list(CLOSERS), ids=list(CLOSERS))
def test_a_job_that_closes_or_fills_its_descriptors_is_recorded_released_and_pinged(
    project, ping_server, body
):
    """These crashed the runner (traceback, exit 1, the row left `running`, no final ping)
    or turned the exit code into 120 at interpreter exit."""
    code_text, code = CLOSERS[body]
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY
    )
    project.add_command("t_close", code_text)
    project.write_cron("t.cron", f"{DAILY} t_close\n")

    exit_code, output = run_with_output(project, "a pipe", "t_close")

    assert exit_code == code, output
    assert "Traceback" not in output or "ValueError: boom" in output
    expect_recorded(project, ping_server, "t_close", code, "a pipe")


@pytest.mark.parametrize("where", ["/dev/full", "a pipe whose reader is gone"])
@pytest.mark.parametrize("body", list(CLOSERS), ids=list(CLOSERS))
def test_the_same_jobs_with_the_runners_own_output_full_or_gone(
    sqlite_project, ping_server, body, where
):
    code_text, code = CLOSERS[body]
    project = sqlite_project
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY
    )
    project.add_command("t_close", code_text)
    project.write_cron("t.cron", f"{DAILY} t_close\n")

    exit_code, _ = run_with_output(project, where, "t_close")

    assert exit_code == code
    expect_recorded(project, ping_server, "t_close", code, where)


def test_after_a_job_closed_both_streams_the_runner_still_says_why_it_ended(sqlite_project):
    project = sqlite_project
    project.add_command("t_close", "sys.stdout.close(); sys.stderr.close(); time.sleep(30)")

    result = project.run_job("--timeout=1s", "t_close")

    assert result.returncode == 124
    said = "cronops: job t_close: timed out after 1s (exit 124); nothing on stderr\n"
    assert result.stderr == said
    assert [r[3:5] for r in project.db.runs("t_close")] == [("timed_out", 124)]


def test_a_ping_retried_while_the_job_has_closed_its_descriptors_never_takes_their_place(
    sqlite_project, httpserver
):
    """A job that closed fds 1 and 2 leaves their numbers free: when the job ran in run_job's
    own process, the start ping's retry opened its socket as fd 1, so what the job wrote there
    went into the ping's connection (seen as exit 120 under load). The job now runs in a forked
    child, whose descriptors are its own; the server holds each step until the job has reached
    it, so the retry is in flight while the job's fds are closed, however loaded the machine."""
    from werkzeug import Response

    project = sqlite_project
    closed, retrying, seen = (project.dir / n for n in ("closed", "retrying", "fd1.txt"))
    starts = []

    def answer(request):
        if request.path.endswith("/start"):
            starts.append(request.path)
            if len(starts) == 1:
                wait_until(closed.exists, "the job to close its fds 1 and 2")
                return Response("busy", status=503)  # so the retry opens its socket after that
            retrying.touch()
            # The retry's connection stays open while the job looks at its fd 1.
            wait_until(seen.exists, "the job to look at its fd 1 during the retry")
        return Response("OK", headers={"Ping-Body-Limit": "100000"})

    httpserver.expect_request("").respond_with_handler(answer)
    project.write_env(HEALTHCHECKS_PING_URL=httpserver.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY)
    project.add_command(
        "t_close",
        f"""
        os.close(1); os.close(2)
        open({str(closed)!r}, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists({str(retrying)!r}) and time.monotonic() < deadline:
            time.sleep(0.01)  # the start ping is retried meanwhile
        with open({str(seen)!r}, "w") as f:
            f.write(os.readlink("/proc/self/fd/1") if os.path.exists("/proc/self/fd/1") else "")
        """,
    )
    project.write_cron("t.cron", f"{DAILY} t_close\n")

    result = project.run_job("--timeout=30s", "t_close")

    assert len(starts) == 2  # the retry happened while fds 1 and 2 were closed
    assert not seen.read_text().startswith("socket:"), seen.read_text()
    assert result.returncode == 0, result.stderr
    assert [r[3:5] for r in project.db.runs("t_close")] == [("succeeded", 0)]
    finals = [req.path for req, _ in httpserver.log if not req.path.endswith("/start")]
    assert finals == [f"/{PING_KEY}/t_close"]
    httpserver.check_handler_errors()  # a wait in the handler that gave up fails here


def into_a_reader_that_does_not_read(project, job: str, stderr_too: bool = False):
    """`run_job job` with its stdout (and stderr) on a pipe whose read end is held open and
    not read: (the process, the read end, for the test to read or close)."""
    reader, writer = os.pipe()
    proc = subprocess.Popen(
        project.command("run_job", job),
        cwd=project.dir,
        env=base_env(),
        stdout=writer,
        stderr=writer if stderr_too else None,
    )
    os.close(writer)
    return proc, reader


def recorded(project, fields: str) -> tuple:
    """`fields` of the one run, once it is recorded (no longer `running`)."""

    def outcome():
        rows = project.db.query(f"SELECT {fields} FROM ops_jobrun")
        return rows and rows[0][0] != "running" and rows[0]

    return wait_until(outcome, "the run's record", timeout=60)


def _when(value) -> dt.datetime:
    """A timestamp as either database gives it back, aware (UTC)."""
    if isinstance(value, str):  # SQLite
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def test_a_reader_that_never_reads_holds_neither_the_record_nor_the_heartbeat(project):
    """`run_job --timeout=3s <2 MB of output> 2>&1 | sleep 25`: the timeout fires, and the
    outcome is recorded and the claim released within timeout + kill-after + 2 s while run_job
    still cannot write a byte more; until then the claim's heartbeat never goes stale."""
    heartbeat = 2.0  # stale after 6 s: the run's end takes 2 s (the output's bound) past 3 s
    project.write_env(OPS_HEARTBEAT_SECONDS=heartbeat)
    project.add_command(
        "t_flood", "sys.stdout.write('x' * 2_000_000 + '\\n'); sys.stdout.flush(); time.sleep(60)"
    )
    project.write_cron("t.cron", f"{DAILY} --no-ping --timeout=3s --kill-after=5s t_flood\n")
    proc, reader = into_a_reader_that_does_not_read(project, "t_flood", stderr_too=True)
    ages: list[float] = []

    def recorded():
        [(state, beat)] = project.db.query("SELECT state, heartbeat_at FROM ops_slotclaim") or [
            (None, None)
        ]
        if state == "running":
            ages.append((dt.datetime.now(dt.UTC) - _when(beat)).total_seconds())
        return state not in (None, "running") and state

    try:
        assert wait_until(recorded, "the run's record", timeout=60) == "timed_out"
        assert proc.poll() is None  # still waiting to write the rest of its output: no matter
        [(started, finished, outcome, code)] = project.db.query(
            "SELECT started_at, finished_at, outcome, exit_code FROM ops_jobrun"
        )
        assert (outcome, code) == ("timed_out", 124)
        assert (_when(finished) - _when(started)).total_seconds() <= 3 + 5 + 2
        assert ages and max(ages) < 3 * heartbeat, ages  # 3 intervals: stale to another server
    finally:
        os.close(reader)  # the reader goes away: run_job's writes fail, and it ends
        proc.wait(60)
    assert proc.returncode == 124


def test_a_reader_that_stops_reading_neither_slows_the_job_nor_loses_its_output(sqlite_project):
    """`run_job … | less`, left on its first page: the job prints its 2 MB and ends, its
    success is recorded at once; the reader, when it reads on, gets every byte."""
    project = sqlite_project
    size = 2_000_000
    project.add_command("t_flood", f"sys.stdout.write('x' * {size} + '\\n')")
    project.write_cron("t.cron", f"{DAILY} --no-ping --timeout=1m t_flood\n")
    proc, reader = into_a_reader_that_does_not_read(project, "t_flood")
    try:
        assert recorded(project, "outcome, exit_code, note") == ("succeeded", 0, "")
        assert proc.poll() is None  # what the reader has not taken yet is still to be written
        received = b""
        while chunk := os.read(reader, 1 << 16):
            received += chunk
    finally:
        os.close(reader)
        proc.wait(60)
    assert proc.returncode == 0
    assert received == b"x" * size + b"\n"


def _spill_sizes(pid: int) -> list[int]:
    """Sizes of the deleted temporary files process `pid` holds open (run_job's spills), but
    on its standard descriptors (pytest's capture of stderr is one)."""
    sizes = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if int(fd) <= 2:
            continue
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith("(deleted)"):
                sizes.append(os.stat(f"/proc/{pid}/fd/{fd}").st_size)
        except OSError:
            continue
    return sizes


def test_what_a_stalled_reader_leaves_is_bounded_and_then_the_job_waits_for_it(sqlite_project):
    """Past 256 KiB in memory and 32 MiB in a temporary file, the job's output waits for the
    reader as a plain command's would: a job printing 200 MB into a reader that never reads
    runs into its timeout, and run_job's memory and temporary file stay bounded."""
    from ops.run.outbox import CHUNK, SPILL_MAX

    project = sqlite_project
    project.add_command(
        "t_flood", "chunk = 'x' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.write(chunk)"
    )
    project.write_cron("t.cron", f"{DAILY} --no-ping --timeout=5s t_flood\n")
    proc, reader = into_a_reader_that_does_not_read(project, "t_flood")
    try:
        assert recorded(project, "outcome, exit_code") == ("timed_out", 124)
        assert proc.poll() is None
        [spill] = _spill_sizes(proc.pid)
        assert SPILL_MAX - CHUNK <= spill <= SPILL_MAX
        rss = next(
            int(line.split()[1])
            for line in open(f"/proc/{proc.pid}/status")
            if line.startswith("VmRSS:")
        )
        assert rss < 120 * 1024, f"run_job holds {rss} KiB"
    finally:
        os.close(reader)
        proc.wait(60)
    assert proc.returncode == 124
