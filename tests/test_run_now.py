"""Run now for real (SQLite and PostgreSQL): the process a web request starts is run_job, detached
from the process that started it (a session of its own, nobody's child there, /dev/null for
stdin, its own --log), with a cron fire's guarantees (the claim decides; the history and the
action say who started it)."""

import os
from pathlib import Path

import pytest

from .conftest import DAILY, wait_until

START = """
from django.utils import timezone
from ops.control import actions, runnow
action = actions.record("run_now", "held", "alice", timezone.now(), note="manage.py run_job held")
runnow.spawn(runnow.run_job_argv("held", None, False), action.pk)
print(action.pk)
"""


def stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...


@pytest.fixture
def held(project, tmp_path):
    """A job that runs until a file appears (tests release it)."""
    go = tmp_path / "go"
    project.add_command(
        "t_hold",
        f"""
        import pathlib
        print("holding", flush=True)
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.02)
        print("released")
        """,
    )
    project.write_cron("t.cron", f"{DAILY}  --name=held t_hold\n")
    return go


def test_run_now_starts_run_job_detached_in_a_session_of_its_own_and_records_who_started_it(
    project, held
):
    shell = project.popen("shell", "-c", START)
    out, err = shell.communicate(timeout=120)  # returns while the job still holds: detached
    assert shell.returncode == 0, err
    assert out.split()[-1].isdigit()  # the action's id
    assert not held.exists()

    def running():
        rows = project.db.query("SELECT id, pid FROM ops_jobrun WHERE outcome = 'running'")
        return rows[0] if rows else None

    run_id, pid = wait_until(running, "the run to be recorded")
    _, ppid, _, session = stat_fields(pid)[:4]
    assert int(session) != os.getsid(0)  # not the starter's session
    assert int(ppid) not in (shell.pid, os.getpid())  # nobody's child where it was started
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    log = project.dir / "var" / "log" / "held.log"
    assert os.readlink(f"/proc/{pid}/fd/1") == os.readlink(f"/proc/{pid}/fd/2") == str(log)
    # The run's row comes first; run_job attaches the action to it in a write of its own.
    wait_until(
        lambda: project.db.query("SELECT run_id FROM ops_jobaction") == [(run_id,)],
        "the jobs page action to name the run it started",
    )

    second = project.run_job("held")  # a cron fire meanwhile meets the lock, as ever
    assert second.returncode == 75, second.stderr
    held.touch()
    wait_until(
        lambda: (
            project.db.query("SELECT outcome FROM ops_jobrun WHERE id = ?", (run_id,))
            == [("succeeded",)]
        ),
        "the run to succeed",
    )
    [who] = project.db.query("SELECT started_by, trigger FROM ops_jobrun WHERE id = ?", (run_id,))
    assert who == ("alice", "page")
    assert "holding" in log.read_text() and "released" in log.read_text()
    skip = project.db.query("SELECT outcome, trigger FROM ops_jobrun WHERE id <> ?", (run_id,))
    assert skip in ([("skipped", "hand")], [("skipped", "terminal")])  # nobody's action


def test_the_action_id_never_reaches_the_job_or_what_it_starts(project, tmp_path):
    seen = tmp_path / "seen"
    project.add_command(
        "t_env", f"open({str(seen)!r}, 'w').write(os.environ.get('OPS_ACTION_ID', 'unset'))"
    )
    project.write_cron("t.cron", f"{DAILY}  --name=held t_env\n")
    shell = project.manage("shell", "-c", START)
    assert shell.returncode == 0, shell.stderr
    wait_until(seen.exists, "the job to run")
    wait_until(lambda: seen.read_text(), "the job to write")
    assert seen.read_text() == "unset"


@pytest.mark.process
def test_a_double_click_on_run_it_again_force_runs_the_slot_once(project):
    """Issue 22, item 3, for real: the project served (runserver), the job's slot done, two
    POSTs at once of the confirmation's "Run it again (--force)". Before: two actions, two
    run_jobs, two succeeded runs of one slot."""
    import re
    import threading

    import requests

    from .browser import Server
    from .conftest import base_env

    project.write_cron("t.cron", f"{DAILY}  --name=report sleep_demo --seconds=0\n")
    first = project.run_job("report")
    assert first.returncode == 0, first.stderr
    server = Server(project.dir, base_env())
    server.prepare("admin", "correct-horse-battery")
    server.start()
    try:
        session = requests.Session()
        login = server.url + "/admin/login/"
        session.get(login, timeout=30)
        answer = session.post(
            login,
            data={
                "username": "admin",
                "password": "correct-horse-battery",
                "csrfmiddlewaretoken": session.cookies["csrftoken"],
                "next": "/admin/",
            },
            timeout=30,
        )
        assert answer.status_code == 200 and "Log out" in answer.text
        target = server.url + "/admin/ops/job/report/run/"
        page = session.get(target, timeout=30).text
        assert 'value="Run it again (--force)"' in page
        form = {
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
            "date": "",
            "force": "1",
            "token": found[1]
            if (found := re.search(r'name="token" value="([^"]+)"', page))
            else "",
        }
        barrier = threading.Barrier(2)
        codes: list[int] = []

        def click() -> None:
            barrier.wait(10)
            codes.append(
                session.post(target, data=form, allow_redirects=False, timeout=60).status_code
            )

        clicks = [threading.Thread(target=click) for _ in range(2)]
        for thread in clicks:
            thread.start()
        for thread in clicks:
            thread.join(90)

        def runs_ended():  # every action's run recorded, and none running
            # The actions first: once an action has its run, that run's row exists for the
            # second query (the other order could miss a run created between the two).
            waiting = project.db.query("SELECT count(*) FROM ops_jobaction WHERE run_id IS NULL")
            rows = project.db.query("SELECT outcome FROM ops_jobrun ORDER BY id")
            return rows if waiting == [(0,)] and ("running",) not in rows else None

        wait_until(runs_ended, "the forced run to end", 60)
    finally:
        server.stop()
    assert project.db.query("SELECT count(*) FROM ops_jobaction") == [(1,)]
    assert sorted(codes) == [302, 409]
    assert project.db.query("SELECT outcome FROM ops_jobrun ORDER BY id") == [
        ("succeeded",),
        ("succeeded",),
    ]
    # Issue 32: the history says the forced run came from the Jobs page, and who clicked.
    [(trigger, started_by)] = project.db.query(
        "SELECT trigger, started_by FROM ops_jobrun ORDER BY id DESC LIMIT 1"
    )
    assert (trigger, started_by) == ("page", "admin")
