"""run_job's pings against a server that behaves like healthchecks (tests/hcserver.py).

Real processes (a deployed copy of the project) pinging the stand-in on 127.0.0.1; each test
asserts what the check shows on the server: its state, its stored exit status and bodies.
"""

import os
import re
import shutil
import signal
import socket
import subprocess

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from werkzeug import Response

from ops.monitors.redact import Redactor, known_secrets
from ops.run.output import Tail, Tee

from .conftest import (
    DAILY,
    DAILY_DATE,
    PING_KEY,
    SLEEPER,
    base_env,
    require,
    wait_for_line,
    wait_until,
)


def ping_to(project, hc, **extra) -> None:
    project.write_env(HEALTHCHECKS_PING_URL=hc.ping_url, HEALTHCHECKS_PING_KEY=PING_KEY, **extra)


def settle(hc, count: int, timeout: float = 15) -> None:
    """Wait until the server has acted on `count` pings (a held request ends in its thread)."""
    wait_until(lambda: len(hc.pings) >= count, f"the server to act on {count} pings", timeout)


# --- 1. bodies cut on a character boundary ------------------------------------------------


def test_a_cut_multibyte_body_still_counts_as_success_on_a_filter_by_body_check(sqlite_project, hc):
    project = sqlite_project
    ping_to(project, hc)
    check = hc.add(slug="t_accents", filter_http_body=True, success_kw="é")
    project.add_command("t_accents", "print('é' * 20000)")
    result = project.run_job("t_accents")
    assert result.returncode == 0
    assert "ping" not in result.stderr
    final = hc.pings_of("t_accents")[-1]
    assert (final.kind, final.action, final.status) == ("success", "success", 200)
    assert 0 < len(final.body) <= hc.body_limit
    final.body.decode("utf-8")  # strictly valid
    assert check.state == "up"
    [(tail,)] = project.db.query("SELECT output_tail FROM ops_jobrun")
    assert "\ufffd" not in tail and tail.rstrip().endswith("éé")


def test_a_body_the_server_cuts_inside_a_character_is_resent_so_any_cut_is_valid(
    sqlite_project, hc
):
    # The start is held past half the budget, so the final ping never learns the server's
    # Ping-Body-Limit (100 here, below cronops' 10,000 default): the server cuts the body to
    # its first 100 bytes, inside a 3-byte character, and its strict decode answers 500.
    project = sqlite_project
    ping_to(project, hc, OPS_PING_BUDGET_SECONDS=4)
    hc.body_limit = 100
    check = hc.add(slug="t_euros", filter_http_body=True, failure_kw="no euro")
    hc.delay("start", 3)
    project.add_command(
        "t_euros", "print('€' * 20000); raise CommandError('no euro', returncode=3)"
    )
    # The cut falls inside a character: the note and the truncation notice take 84 bytes.
    result = project.run_job("t_euros")
    assert result.returncode == 3
    assert "ping" not in result.stderr, result.stderr
    final = hc.pings_of("t_euros")[-1]
    assert (final.kind, final.action, final.status) == ("3", "fail", 200)
    assert final.body.isascii() and len(final.body) == hc.body_limit
    assert (check.state, check.exit_status) == ("down", 3)


def test_the_history_tail_never_starts_inside_a_character():
    tail = Tail(11)
    tail.write("€".encode() * 20)  # 3 bytes each: the last 11 bytes start inside one
    text = tail.text()
    assert "\ufffd" not in text and text.endswith("€€€")


def test_the_tail_never_puts_one_streams_output_inside_the_others_unfinished_line():
    tail = Tail(100_000)
    tee = Tee(tail)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    tee.start(out_read, err_read)

    def put(fd: int, data: bytes) -> None:
        """Write `data` to a job's stream and wait until the tail has taken it in."""
        before = tail.total
        os.write(fd, data)
        wait_until(lambda: tail.total >= before + len(data), f"the tail to take in {data!r}")

    # A line begun on stderr (an unbuffered writer's `print` writes its pieces one by one),
    # whole lines on stdout meanwhile, then the stderr line's end; a last line without newline.
    put(err_write, b"CommandError: charge failed, exiting with 7")
    put(out_write, b"logical date 2026-12-03\ncharged 12 subscriptions\n")
    put(err_write, b"\n")
    put(out_write, b"done")
    os.close(out_write)
    os.close(err_write)
    tee.finish(10)
    assert tail.total == 97
    assert tail.text().splitlines() == [
        "logical date 2026-12-03",
        "charged 12 subscriptions",
        "CommandError: charge failed, exiting with 7",
        "done",
    ]


@pytest.mark.parametrize("over", [1, 40, 5000])
def test_output_just_over_the_limit_is_headed_by_a_whole_truncation_notice(
    sqlite_project, hc, over
):
    """The notice used to be cut with the output's start: a body of `ted, last 99999 of ...`."""
    project = sqlite_project
    ping_to(project, hc)
    hc.body_limit = 100_000
    hc.add(slug="t_over")
    line = "x" * 99 + "\n"
    total = over + 100_000 + len("the last line\n")
    project.add_command(
        "t_over",
        f"""
        sys.stdout.write('a' * {over} + {line!r} * 1000 + 'the last line\\n')
        """,
    )
    assert project.run_job("t_over").returncode == 0
    body = hc.pings_of("t_over")[-1].body.decode()
    head, rest = body.split("\n", 1)
    assert head == f"[cronops] output truncated: only the end of {total} bytes is shown"
    assert len(body.encode()) <= 100_000 and rest.endswith(line + "the last line\n")
    assert len(body.encode()) > 100_000 - 3  # nothing more would have fitted
    [(tail,)] = project.db.query("SELECT output_tail FROM ops_jobrun")
    assert tail.startswith(f"[cronops] output truncated: only the end of {total} bytes is shown\n")


def test_the_truncation_notice_counts_the_bytes_the_job_wrote_not_their_stored_text():
    """A NUL is stored as U+FFFD (3 bytes) and a secret as `<redacted NAME>`: the notice once
    said `last 30000 of 20000 bytes`."""
    tail = Tail(100_000, redactor=Redactor({"TOKEN": "tok12345"}))
    tail.write(b"\x00" * 20_000 + b"tok12345\n" * 1000)
    text = tail.text(10_000)
    assert text.startswith("[cronops] output truncated: only the end of 29000 bytes is shown\n")
    assert "tok12345" not in text and text.endswith("<redacted TOKEN>\n")


def test_a_resend_after_a_500_keeps_the_end_of_the_output(sqlite_project, httpserver):
    """The ASCII-escaped resend used to keep the start of the longer escaped body: the last
    lines (a success keyword, the error) were the part dropped."""
    project = sqlite_project
    finals = []

    def handler(request):
        if request.path.endswith("/start"):
            return Response("OK", headers={"Ping-Body-Limit": "10000"})
        finals.append(request.get_data())
        return Response("error", status=500) if len(finals) == 1 else Response("OK")

    httpserver.expect_request(re.compile("^/")).respond_with_handler(handler)
    project.write_env(HEALTHCHECKS_PING_URL=httpserver.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY)
    project.add_command(
        "t_resume",
        """
        print("Résumé 中文 processed\\n" * 200 + "DONE")
        """,
    )
    assert project.run_job("t_resume").returncode == 0
    first, resent = finals
    assert not first.isascii() and first.endswith(b"DONE\n")
    assert resent.isascii() and len(resent) <= len(first)
    assert resent.startswith(b"[cronops] output truncated: only the end of ")
    assert resent.endswith(b"R\\xe9sum\\xe9 \\u4e2d\\u6587 processed\nDONE\n")


# --- 2. timeouts and signals report their exit status -------------------------------------


@pytest.mark.parametrize(("how", "code"), [("timeout", 124), ("SIGTERM", 143), ("SIGINT", 130)])
def test_timeouts_and_signals_ping_their_exit_code_and_the_server_stores_it(
    sqlite_project, hc, how, code
):
    project = sqlite_project
    ping_to(project, hc)
    check = hc.add(slug="t_sleep")
    project.add_command("t_sleep", SLEEPER)
    if how == "timeout":
        assert project.run_job("--timeout=1s", "t_sleep", env={"SLEEP": "30"}).returncode == 124
    else:
        proc = project.popen("run_job", "t_sleep", env={"SLEEP": "30"})
        wait_for_line(proc, "working")
        proc.send_signal(getattr(signal, how))
        assert proc.wait(15) == code
        proc.communicate()
    final = hc.pings_of("t_sleep")[-1]
    assert (final.kind, final.action) == (str(code), "fail")
    assert (check.state, check.exit_status) == ("down", code)


# --- 3. a check that does not exist, or exists twice ---------------------------------------


def test_a_missing_check_is_one_line_saying_what_to_do_without_the_key(sqlite_project, hc):
    project = sqlite_project
    ping_to(project, hc)
    project.add_command("t_ok", "print('fine')")
    result = project.run_job("t_ok")
    assert result.returncode == 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("cronops:")]
    assert lines == [
        "cronops: job t_ok: the check 't_ok' does not exist on the server (start and success "
        "pings: HTTP 404): run `manage.py sync_healthchecks` or set HEALTHCHECKS_AUTO_CREATE=1 "
        "(or HEALTHCHECKS_PING_KEY is wrong)"
    ]
    assert PING_KEY not in result.stdout + result.stderr
    assert "http" not in result.stderr
    # A wrong key is the same 404 on the server: the same line names it too.
    hc.add(slug="t_ok")
    wrong = project.run_job("t_ok", env={"HEALTHCHECKS_PING_KEY": "wrong-key-wrong-key"})
    assert "does not exist on the server" in wrong.stderr
    assert "HEALTHCHECKS_PING_KEY is wrong" in wrong.stderr


def test_two_checks_with_the_jobs_slug_are_named_as_the_cause(sqlite_project, hc):
    project = sqlite_project
    ping_to(project, hc)
    hc.add(slug="t_ok")
    hc.add(slug="t_ok", name="made by hand")
    project.add_command("t_ok", "print('fine')")
    result = project.run_job("t_ok")
    assert result.returncode == 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("cronops:")]
    assert lines == [
        "cronops: job t_ok: two checks share the slug 't_ok' on the server (start and success "
        "pings: HTTP 409 ambiguous slug): delete or rename one of them in the healthchecks.io "
        "project"
    ]
    assert {p.status for p in hc.pings_of("t_ok")} == set()  # nothing was recorded


# --- 4. a --ping URL with a query ---------------------------------------------------------


def test_a_ping_url_with_a_query_gets_the_suffix_in_its_path_and_rid_in_its_query(
    sqlite_project, hc
):
    project = sqlite_project
    project.add_command("t_ok", "print('fine')")
    url = f"{hc.ping_url}{PING_KEY}/viaq?create=1"
    result = project.run_job(f"--ping={url}", "t_ok")
    assert result.returncode == 0, result.stderr
    assert "ping" not in result.stderr
    start, final = hc.pings_of("viaq")
    assert (start.action, start.status, final.action) == ("start", 201, "success")
    assert start.rid == final.rid and start.rid
    assert hc.check("viaq").state == "up"


# --- 6. a hanging name lookup stays within the budget ---------------------------------------


def test_a_resolver_that_never_answers_keeps_the_run_within_its_ping_budget(
    sqlite_project, tmp_path
):
    require(
        os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("getent")),
        "needs root, unshare and getent (a private mount namespace for resolv.conf)",
    )
    project = sqlite_project
    budget = 2
    dead_dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # receives queries, never answers; an address of its own (another run may hold :53 on one)
    nameserver = f"127.77.{os.getpid() % 250}.{(id(dead_dns) >> 4) % 250 + 1}"
    dead_dns.bind((nameserver, 53))
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {nameserver}\noptions timeout:30 attempts:1\n")
    host = "hc.cronops-test.example"
    project.write_env(
        HEALTHCHECKS_PING_URL=f"http://{host}:8000/",
        HEALTHCHECKS_PING_KEY=PING_KEY,
        OPS_PING_BUDGET_SECONDS=budget,
    )
    project.add_command("t_fail", "raise CommandError('failing on purpose', returncode=3)")

    def in_namespace(*command):
        return [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"',
            str(resolv),
            *command,
        ]

    try:
        # The trap is real: in there, a lookup of the name hangs.
        probe = subprocess.run(
            in_namespace("timeout", "2", "getent", "hosts", host), capture_output=True
        )
        assert probe.returncode == 124, probe
        proc = subprocess.Popen(
            in_namespace(*project.command("run_job", "t_fail")),
            cwd=project.dir,
            env=base_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Start-up (a few seconds on a loaded machine) + the budget; a lookup left unbounded
        # would hold the process for the resolver's 30 s.
        try:
            proc.wait(timeout=budget + 12)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("the final ping outlived its budget") from None
        _, err = proc.communicate()
    finally:
        dead_dns.close()
    assert proc.returncode == 3, err
    assert "name resolution timed out" in err
    assert [r[3:5] for r in project.db.runs()] == [("failed", 3)]


# --- 7. catch-up bursts and rate limits -----------------------------------------------------


def test_a_catch_up_burst_stays_within_the_hosted_rate_limit(sqlite_project, hc):
    import datetime as dt

    project = sqlite_project
    hc.hosted = True
    ping_to(project, hc)
    check = hc.add(slug="t_daily")
    project.add_command(
        "t_daily",
        "print('charged', options['logical_date'])",
        "parser.add_argument('--logical-date')",
    )
    project.write_cron("t.cron", f"{DAILY} --catch-up=3 t_daily\n")
    today = DAILY_DATE
    first = project.run_job(f"--logical-date={today - dt.timedelta(days=4)}", "t_daily")
    assert first.returncode == 0
    result = project.run_job("t_daily")
    assert result.returncode == 0, result.stderr
    assert [r[3] for r in project.db.runs("t_daily")] == ["succeeded"] * 5
    assert "rate-limited" not in result.stderr
    assert [p.action for p in hc.pings_of("t_daily")] == ["start", "success"] * 2
    summary = hc.pings_of("t_daily")[-1].body.decode()
    assert summary.startswith("cronops: caught up ")
    assert summary.count(": succeeded") == 3
    assert check.state == "up"


def test_a_failed_catch_up_slot_fails_the_final_ping_with_run_jobs_exit_code(sqlite_project, hc):
    import datetime as dt

    project = sqlite_project
    ping_to(project, hc)
    check = hc.add(slug="t_daily")
    today = DAILY_DATE
    bad = today - dt.timedelta(days=1)
    project.add_command(
        "t_daily",
        f"if options['logical_date'] == '{bad}': raise CommandError('bad day', returncode=4)",
        "parser.add_argument('--logical-date')",
    )
    project.write_cron("t.cron", f"{DAILY} --catch-up=3 t_daily\n")
    assert (
        project.run_job(f"--logical-date={today - dt.timedelta(days=2)}", "t_daily").returncode == 0
    )
    result = project.run_job("t_daily")
    assert result.returncode == 4
    final = hc.pings_of("t_daily")[-1]
    assert (final.kind, check.state, check.exit_status) == ("4", "down", 4)
    assert f"{bad}" in final.body.decode() and "failed, exit 4" in final.body.decode()


def test_a_server_that_rate_limits_is_reported_as_rate_limited_in_one_line(sqlite_project, hc):
    project = sqlite_project
    hc.hosted = True
    ping_to(project, hc)
    hc.add(slug="t_ok")
    project.add_command("t_ok", "print('fine')")
    runs = [project.run_job("t_ok") for _ in range(3)]  # 6 pings in a few seconds
    assert [r.returncode for r in runs] == [0, 0, 0]
    assert "rate-limited" not in runs[0].stderr + runs[1].stderr
    lines = [line for line in runs[2].stderr.splitlines() if line.startswith("cronops:")]
    assert len(lines) == 1 and "rate-limited" in lines[0], runs[2].stderr


def test_a_uuid_ping_the_hosted_server_drops_is_reported_as_rate_limited(sqlite_project, hc):
    project = sqlite_project
    hc.hosted = True
    project.write_env(HEALTHCHECKS_PING_URL=hc.ping_url)
    check = hc.add(slug="t_ok")
    project.add_command("t_ok", "print('fine')")
    runs = [project.run_job(f"--ping={check.uuid}", "t_ok") for _ in range(3)]
    assert "rate-limited" in runs[2].stderr
    assert "OK (rate limited)" in runs[2].stderr


# --- 9.15 secrets stay out of ping bodies and the history -----------------------------------

STRIPE = "sk_live_" + "q7Zr" * 8
DB_PASSWORD = "Pg-pass-" + "w0rd" * 4


def _assert_no_secret(hc, project, secrets):
    stored = b"".join(p.body for p in hc.pings).decode()
    history = "".join(t or "" for (t,) in project.db.query("SELECT output_tail FROM ops_jobrun"))
    notes = "".join(n or "" for (n,) in project.db.query("SELECT note FROM ops_jobrun"))
    for secret in secrets:
        for part in (secret, secret[: len(secret) // 2], secret[len(secret) // 2 :]):
            assert part not in stored, f"part of a secret reached the ping body: {part!r}"
            assert part not in history + notes, f"part of a secret reached the history: {part!r}"


def test_no_known_secret_reaches_a_ping_body_or_the_history_from_diffsettings_or_environ(
    pg_project, hc
):
    project = pg_project
    # A database URL with a password (the test server trusts local connections and ignores it).
    url = project.db.url.replace("postgres://postgres@", f"postgres://postgres:{DB_PASSWORD}@")
    api_key = "hcw_" + "a1b2" * 7
    ping_to(
        project,
        hc,
        DATABASE_URL=url,
        HEALTHCHECKS_API_KEY=api_key,
        STRIPE_API_KEY=STRIPE,
        OPS_REDACT="STRIPE_API_KEY",
    )
    hc.add(slug="diffsettings")
    hc.add(slug="t_env")
    hc.body_limit = 100_000
    project.add_command("t_env", "print(dict(os.environ)); print(repr(os.environ))")
    settings_run = project.run_job("diffsettings", "--all")
    env_run = project.run_job("t_env")
    assert settings_run.returncode == env_run.returncode == 0, settings_run.stderr
    secrets = [project.settings["SECRET_KEY"], PING_KEY, api_key, DB_PASSWORD, url, STRIPE]
    # The job's own output to cron's log stays the job's.
    assert project.settings["SECRET_KEY"] in settings_run.stdout
    assert STRIPE in env_run.stdout and DB_PASSWORD in env_run.stdout
    _assert_no_secret(hc, project, secrets)
    body = hc.pings_of("t_env")[-1].body.decode()
    assert "<redacted STRIPE_API_KEY>" in body and "<redacted DATABASE_URL>" in body
    assert "<redacted SECRET_KEY>" in hc.pings_of("diffsettings")[-1].body.decode()


@pytest.mark.parametrize("split", [1, 8, 20])
def test_a_secret_across_the_cut_leaks_no_part_of_itself(sqlite_project, hc, split):
    project = sqlite_project
    ping_to(project, hc, STRIPE_API_KEY=STRIPE, OPS_REDACT="STRIPE_API_KEY")
    hc.add(slug="t_cut")
    hc.body_limit = 1000
    # The server keeps 1000 bytes: the body's cut falls `split` bytes into the secret.
    project.add_command(
        "t_cut",
        f"""
        sys.stdout.write('a' * 5000 + {STRIPE!r} + 'z' * {1000 - len(STRIPE) + split - 1} + '\\n')
        """,
    )
    assert project.run_job("t_cut").returncode == 0
    body = hc.pings_of("t_cut")[-1].body
    assert len(body) <= 1000
    _assert_no_secret(hc, project, [STRIPE])


def test_a_secret_straddling_the_ring_buffers_start_leaks_no_part():
    secret = "s3cr3t-" + "v" * 20
    redactor = Redactor({"X": secret})
    for split in range(1, len(secret)):
        tail = Tail(50, redactor=redactor)
        tail.write(b"." * 100 + secret.encode() + b"-" * (50 - split))
        data = tail.bytes()
        assert len(data) <= 50
        assert secret[-split:].encode() not in data, (split, data)


def test_known_secrets_cover_the_keys_the_database_password_and_ops_redact():
    from types import SimpleNamespace

    settings = SimpleNamespace(
        SECRET_KEY="k" * 50,
        HEALTHCHECKS_PING_KEY="ping-key-123",
        HEALTHCHECKS_API_KEY="a" * 32,
        DATABASES={"default": {"PASSWORD": "pw-123456"}},
        OPS_REDACT=["MY_TOKENS", "SHORT"],
        MY_TOKENS={"a": "token-one-1", "b": "token-two-2"},
        SHORT="abc",  # under 8 characters: not worth replacing everywhere
    )
    found = set(known_secrets(settings).values())
    assert {"k" * 50, "ping-key-123", "a" * 32, "pw-123456", "token-one-1", "token-two-2"} <= found
    assert "abc" not in found
    redactor = Redactor({"P": "p@ss/word"})
    assert redactor.bytes(b"postgres://u:p%40ss%2Fword@h/db") == b"postgres://u:<redacted P>@h/db"


def test_every_databases_password_and_nested_ops_redact_values_are_secrets():
    from types import SimpleNamespace

    settings = SimpleNamespace(
        SECRET_KEY="k" * 50,
        HEALTHCHECKS_PING_KEY="",
        HEALTHCHECKS_API_KEY="",
        DATABASES={"default": {"PASSWORD": ""}, "replica": {"PASSWORD": "replica-Pw-123456"}},
        OPS_REDACT=["PAYMENT"],
        PAYMENT={"stripe": {"live": ["sk-live-0123456789"]}},
    )
    found = known_secrets(settings)
    assert found["the replica database password"] == "replica-Pw-123456"
    assert "sk-live-0123456789" in found.values()


def test_a_passphrase_wrapped_over_lines_is_redacted_whole():
    secret = "correct horse battery staple is my secret key 2026 yes"
    redactor = Redactor({"SECRET_KEY": secret})
    import textwrap

    for printed in (textwrap.fill(f"key={secret}", 20), f"key = {secret}\n", "x\n" + secret):
        out = redactor.text(printed)
        assert "<redacted SECRET_KEY>" in out, out
        for word in ("horse", "staple", "2026 yes"):
            assert word not in out, out


@hsettings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "correct horse",
                "battery staple",
                "correct",
                " ",
                "\n  ",
                "\t",
                "x",
                "p%40ss",
                "p@ss/word",
                "p@ss",
                "word",
                "\\",
            ]
        ),
        max_size=12,
    )
)
def test_the_pattern_is_only_skipped_where_it_could_not_match(pieces):
    """A Redactor compiles its pattern only for text holding a form's first word: the answer is
    the pattern's own either way."""
    redactor = Redactor({"PHRASE": "correct horse battery staple", "P": "p@ss/word"})
    data = "".join(pieces).encode()
    pattern = redactor.pattern()
    assert pattern is not None
    expected = pattern.sub(lambda m: redactor._name(m.group()), data)
    assert redactor.bytes(data) == expected


def test_text_without_a_secrets_first_word_compiles_no_pattern():
    from ops.monitors import redact

    redact._compiled.cache_clear()
    redactor = Redactor({"SECRET_KEY": "django-insecure-0123456789abcdef"})
    assert redactor.text("noop --x=1") == "noop --x=1"
    assert redact._compiled.cache_info().currsize == 0
    assert redactor.text("key django-insecure-0123456789abcdef") == "key <redacted SECRET_KEY>"
    assert redact._compiled.cache_info().currsize == 1


def test_a_secret_passed_as_an_argument_is_not_kept_in_the_history(sqlite_project, hc):
    project = sqlite_project
    ping_to(project, hc, STRIPE_API_KEY=STRIPE, OPS_REDACT="STRIPE_API_KEY")
    hc.add(slug="t_arg")
    project.add_command("t_arg", "print('charged')", "parser.add_argument('key')")
    assert project.run_job("t_arg", STRIPE).returncode == 0
    [(command,)] = project.db.query("SELECT command FROM ops_jobrun")
    assert STRIPE not in command
    assert command == "t_arg <redacted STRIPE_API_KEY>"


def test_catch_up_before_a_slot_held_elsewhere_sends_the_log_then_one_summary(sqlite_project, hc):
    """The current slot busy in another run (a second checkout on this machine): the missed
    days still run, then one /log for the busy slot and one summary; never a ping per day.
    (A current slot already *done* leaves nothing to catch up: it is the catch-up floor.)"""
    import datetime as dt

    project = sqlite_project
    ping_to(project, hc)
    check = hc.add(slug="t_daily")
    project.add_command(
        "t_daily",
        """
        print('charged', options['logical_date'], flush=True)
        from django.conf import settings
        hold = settings.BASE_DIR / 'hold'
        while hold.exists() and hold.read_text() == options['logical_date']:
            time.sleep(0.05)
        """,
        "parser.add_argument('--logical-date')",
    )
    project.write_cron("t.cron", f"{DAILY} --catch-up=3 t_daily\n")
    today = DAILY_DATE
    first = today - dt.timedelta(days=3)
    assert project.run_job(f"--logical-date={first}", "t_daily").returncode == 0
    (project.dir / "hold").write_text(today.isoformat())
    holder = project.popen(
        "run_job",
        "--no-ping",
        f"--logical-date={today}",
        "t_daily",
        env={"OPS_LOCK_DIR": project.dir / "lock2"},
    )
    try:
        wait_for_line(holder, "charged")  # holds today's slot
        before = len(hc.pings_of("t_daily"))
        result = project.run_job("t_daily")
    finally:
        (project.dir / "hold").unlink()
        holder.wait(30)
    assert result.returncode == 75, result.stderr
    assert result.stdout.count("charged") == 2  # the two missed days, oldest first
    log, summary = hc.pings_of("t_daily")[before:]
    assert log.action == "log" and log.body.decode().startswith("skipped: running since ")
    assert (summary.kind, summary.action) == ("success", "success")
    assert summary.body.decode().count(": succeeded") == 2
    assert check.state == "up"


def test_the_system_check_warns_about_an_ops_redact_name_that_names_nothing(settings, monkeypatch):
    from ops.checks import check_redact_names

    settings.OPS_REDACT = ["STRIPE_API_KEY", "STRIPE_APIKEY"]
    monkeypatch.setenv("STRIPE_API_KEY", STRIPE)
    monkeypatch.delenv("STRIPE_APIKEY", raising=False)
    [warning] = check_redact_names()
    assert warning.id == "ops.W006"
    assert "STRIPE_APIKEY" in warning.msg and STRIPE not in warning.msg + warning.hint


def test_quiet_without_a_usable_temporary_directory_passes_the_output_through(monkeypatch):
    """--quiet spools to a temporary file; with none to be had (a full or read-only TMPDIR and
    /tmp) the Tee raised after the claim, and the run was never recorded. Now quiet ends: the
    output passes through, and the note says so."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/cronops-tmp")
    tee = Tee(Tail(1000), quiet=True)
    assert tee.spool_problem.startswith("--quiet could not spool the output (")
    assert tee.spool_problem.endswith("): it passed through")
    assert not tee._spooled(b"output")  # passes through
