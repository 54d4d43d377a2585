"""run_job's pings against the server's rules for the order of events and for body filters.

The server pairs a start and its final ping by `rid` in the order it acts on them: a `/start`
acted on after its run's success leaves the check "started", and it goes down one grace later.
With "filter by HTTP body" on, keywords in a ping's body decide what it is, whatever its URL
says. Real processes (a deployed copy of the project) ping the stand-in (tests/hcserver.py).
"""

import time

from .conftest import PING_KEY


def ping_to(project, hc, **extra) -> None:
    project.write_env(HEALTHCHECKS_PING_URL=hc.ping_url, HEALTHCHECKS_PING_KEY=PING_KEY, **extra)


def settle(hc, count: int, timeout: float = 15) -> None:
    """Wait until the server has acted on `count` pings (a held request ends in its thread)."""
    deadline = time.monotonic() + timeout
    while len(hc.pings) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(hc.pings) >= count, hc.pings


# --- a start never lands after the final ping ---------------------------------------------


def test_a_start_still_in_flight_when_the_job_ends_never_lands_after_the_success(
    sqlite_project, hc
):
    project = sqlite_project
    ping_to(project, hc, OPS_PING_BUDGET_SECONDS=4)
    check = hc.add(slug="t_quick")
    # The server holds /start longer than the final ping waits for it (half the budget), and
    # drops it once its client goes away (nginx's way); the success is acted on at once but
    # answered late, so the run is still alive then.
    hc.delay("start", 3)
    hc.slow_answer("success", 2)
    project.add_command("t_quick", "print('quick')")
    result = project.run_job("t_quick")
    assert result.returncode == 0
    settle(hc, 2)
    kinds = [(p.kind, p.action) for p in hc.pings_of("t_quick")] + [
        (p.kind, p.action) for p in hc.pings if p.action == "aborted"
    ]
    assert ("success", "success") in kinds
    acted = [p for p in hc.pings if p.action in ("start", "success")]
    assert [p.kind for p in acted][-1] == "success", acted
    assert check.state == "up"


def test_a_start_an_intermediary_delivers_after_the_success_is_followed_by_the_success_again(
    sqlite_project, hc
):
    # An intermediary that had the whole /start delivers it after the success whatever the
    # client does (a proxy that does not abort on a client's close, a queue in front of the
    # server): the final ping, sent after half the budget, lands first. Held until the server
    # has acted on the success, not for a time: on a loaded machine a 3 s hold could end
    # before the job did, and the path under test went untried.
    project = sqlite_project
    ping_to(project, hc, OPS_PING_BUDGET_SECONDS=4)
    check = hc.add(slug="t_held")
    hc.hold_until("start", "success")
    project.add_command("t_held", "print('quick', time.time(), flush=True)")
    result = project.run_job("t_held")
    took = time.time() - float(result.stdout.split("quick", 1)[1].split()[0])
    assert result.returncode == 0
    assert "ping" not in result.stderr, result.stderr
    settle(hc, 3)  # the success, the held start, the success again
    acted = [(p.kind, p.action, p.rid) for p in hc.pings_of("t_held")]
    rid = acted[0][2]
    # The same run's success again after its late start: the server closes the run.
    success = ("success", "success", rid)
    assert acted == [success, ("start", "start", rid), success], acted
    assert check.state == "up"
    assert took < 4 + 4, took  # from the job's end: the ping budget, the history row, the exit


# --- "filter by HTTP body": the keywords decide, the exit status does not -------------------


def test_on_a_check_filtering_by_body_the_keywords_outrank_the_exit_status(sqlite_project, hc):
    # What `sync_healthchecks` warns about, as the server does it.
    project = sqlite_project
    ping_to(project, hc)
    check = hc.add(slug="t_kw", filter_http_body=True, success_kw="SUCCESS", failure_kw="ERROR")
    project.add_command(
        "t_kw", "print('batch: SUCCESS, 3 rows'); raise CommandError('late', returncode=3)"
    )
    result = project.run_job("t_kw")
    assert result.returncode == 3
    start, final = hc.pings_of("t_kw")
    assert (start.kind, start.action) == ("start", "ign")  # empty: no duration
    assert (final.kind, final.action, final.exit_status) == ("3", "success", 3)
    assert check.state == "up"  # a failed run, stored as a success: no alert

    # A keyword the tail left out: the final ping is ignored, the check unchanged.
    project.add_command("t_kw2", "print('ERROR early'); print('x' * 20000)")
    hc.add(slug="t_kw2", filter_http_body=True, success_kw="SUCCESS", failure_kw="ERROR")
    assert project.run_job("t_kw2").returncode == 0
    assert [p.action for p in hc.pings_of("t_kw2")] == ["ign", "ign"]
    assert hc.check("t_kw2").status == "new"
