"""Each run in a --log file begins with one header line: its start in TIME_ZONE, the job, the
slot, the run's id and how it was started; only in the log (issue 32; ops/run/loghead.py)."""

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest

from .conftest import DAILY

pytestmark = pytest.mark.process

HEADER = re.compile(
    r"=== (?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?P<zone>\S+)  (?P<job>\S+)  slot (?P<slot>.+?)"
    r"  run #(?P<id>\d+)  (?P<how>.+) ===$"
)


def headers(text: str) -> list[dict]:
    return [m.groupdict() for line in text.splitlines() if (m := HEADER.fullmatch(line))]


def started(project, run_id: str) -> str:
    [(value,)] = project.db.query("SELECT started_at FROM ops_jobrun WHERE id = ?", (run_id,))
    when = dt.datetime.fromisoformat(str(value)).replace(tzinfo=dt.UTC)
    return when.astimezone(ZoneInfo("Europe/Moscow")).strftime("%Y-%m-%d %H:%M:%S")


def test_every_run_in_the_log_begins_with_a_header_in_time_zone_and_the_terminal_gets_none(
    sqlite_project,
):
    project = sqlite_project
    project.write_env(TIME_ZONE="Europe/Moscow")
    project.add_command(
        "t_flaky",
        """
        from django.conf import settings
        path = settings.BASE_DIR / "attempts.txt"
        n = len(path.read_text().splitlines()) + 1 if path.exists() else 1
        path.write_text("x\\n" * n)
        print(f"attempt {n} working", flush=True)
        if n < 2:
            raise CommandError("transient", returncode=75)
        """,
    )
    project.write_cron("t.cron", f"{DAILY} --retries=1 --retry-delay=0.1s --name=charge t_flaky\n")
    log = project.dir / "var" / "log" / "charge.log"
    first = project.run_job(f"--log={log}", "--no-ping", "charge")
    again = project.run_job(f"--log={log}", "--no-ping", "charge")  # already done: a skip
    assert (first.returncode, again.returncode) == (0, 0)
    assert first.stdout == first.stderr == again.stdout == again.stderr == ""  # all in the log
    text = log.read_text()
    found = headers(text)
    ids = [str(row[0]) for row in project.db.query("SELECT id FROM ops_jobrun ORDER BY id")]
    assert [h["id"] for h in found] == ids  # two attempts, then the skip
    [(slot,)] = project.db.query("SELECT DISTINCT slot FROM ops_jobrun")
    assert {(h["job"], h["slot"], h["zone"]) for h in found} == {("charge", slot, "MSK")}
    assert [h["at"] for h in found] == [started(project, i) for i in ids]
    assert [h["how"] for h in found][1] == "retry, attempt 2"
    lines = text.splitlines()
    # each header comes first: before its attempt's output and before the skip's line
    assert lines.index("attempt 1 working") > lines.index(header_line(found[0]))
    assert lines.index("attempt 2 working") > lines.index(header_line(found[1]))
    assert lines[-1].startswith("cronops: job charge: already done for")
    assert lines[-2] == header_line(found[2])
    # The runner's own: not in the history's output tail (nor, so, in a ping's body).
    tails = project.db.query("SELECT output_tail FROM ops_jobrun")
    assert not any("===" in tail for (tail,) in tails)

    by_hand = project.run_job("--no-ping", "--force", "charge")  # no --log: a terminal's run
    assert by_hand.returncode == 0
    assert "===" not in by_hand.stdout + by_hand.stderr


def header_line(h: dict) -> str:
    at, job, slot, run, how = h["at"] + " " + h["zone"], h["job"], h["slot"], h["id"], h["how"]
    return f"=== {at}  {job}  slot {slot}  run #{run}  {how} ==="


def test_quiet_writes_a_header_only_before_what_a_failure_prints(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_maybe",
        """
        print("noise", flush=True)
        if os.environ.get("FAIL"):
            raise CommandError("it failed", returncode=4)
        """,
    )
    log = project.dir / "var" / "log" / "t_maybe.log"
    assert project.run_job(f"--log={log}", "--quiet", "--no-ping", "t_maybe").returncode == 0
    assert log.read_text() == ""
    failed = project.run_job(f"--log={log}", "--quiet", "--no-ping", "t_maybe", env={"FAIL": "1"})
    assert failed.returncode == 4
    lines = log.read_text().splitlines()
    [header] = headers(log.read_text())
    assert (header["job"], header["slot"], header["id"]) == ("t_maybe", "-", "2")
    assert HEADER.fullmatch(lines[0])  # first, then the replayed output (its two pipes in the
    # order their readers spooled them), then the failure's line
    assert sorted(lines[1:3]) == ["CommandError: it failed", "noise"]
    assert lines[3:] == ["cronops: job t_maybe: failed (exit 4): CommandError: it failed"]
