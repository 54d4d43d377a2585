"""install_crontab on real crontabs: throwaway users' crontabs through Debian's `crontab`, and
tab files. Every test runs `manage.py install_crontab` of a deployed copy as a real process."""

import io
import json
import os
import re
import shlex
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from django.core.management.base import OutputWrapper

from .conftest import PING_KEY, add_echo_args
from .test_crontabd import CORPUS, expectation

GOOD = "# Charge every active subscription.\n0 3 * * * charge_daily\n"
MINUS = "\u2212"
# str.splitlines() cuts a line at each of these; cron (and so install_crontab) only at "\n".
# crontab.d refuses the C0 controls among them, so only the others can be in an argument.
LINE_BREAKS_IN_ARGS = "\u2028\u2029\x85"
ODD_BREAKS = LINE_BREAKS_IN_ARGS + "\x0b\x0c\x1c\x1d\x1e"

# Lines python-crontab is known to rewrite or drop, and other lines a crontab really has.
FOREIGN = (
    b"# m h dom mon dow command (the stock header)\n"
    b"SHELL=/bin/sh\n"
    b"NAME = value with spaces\n"
    b"  PADDED=1\n"
    b'QUOTED = "a b"\n'
    b"0 0 * * * /usr/local/bin/backup --daily\n"
    b"00 07 * * 0,7 echo sunday\n"
    b"*/5 * * * *\t/usr/bin/true\t# tab separated\n"
    b"5-1 * * * * echo python-crontab cannot parse this\n"
    b"0 0 * * *\n"
    b"#Ansible: certbot renew\n"
    b"17 4 * * * certbot renew -q\n"
    b"0 0 * * * echo 100\\% done\n"
    b"@reboot /opt/other/start.sh\n"
    b"MAILTO=someone@example.com\n"
    b"# BEGIN cronops /srv/other-project (managed by `manage.py install_crontab`: edit "
    b"crontab.d/, not these lines)\n"
    b"# job other: another project's job\n"
    b"0 1 * * * cd /srv/other-project && ./venv/bin/python manage.py run_job other\n"
    b"# END cronops /srv/other-project\n"
    b"# \xc3\xa9t\xc3\xa9 and a trailing space \n"
)


def install(project, *args, env=None):
    return project.manage("install_crontab", *args, env=env)


def our_block(data: bytes, project) -> bytes:
    text = data.decode()
    start = text.index(f"# BEGIN cronops {project.dir}")
    end = text.index(f"# END cronops {project.dir}\n") + len(f"# END cronops {project.dir}\n")
    return text[start:end].encode()


def without_block(data: bytes, project) -> bytes:
    return data.replace(our_block(data, project), b"")


# A schedule, an argument and an encoding error: each refused by a real `manage.py` process
# (the whole corpus goes through the command in process below, and through the parser alone
# in tests/test_crontabd.py).
REPRESENTATIVE = ["01-tilde-random-minute", "47-logical-date-in-command-args", "59-byte-order-mark"]


@pytest.mark.parametrize(
    "bad", [p for p in CORPUS if p.stem in REPRESENTATIVE], ids=lambda p: p.stem
)
def test_a_malformed_crontab_d_leaves_the_installed_crontab_byte_identical(
    bad, sqlite_project, cron_user
):
    sqlite_project.write_cron("10-good.cron", GOOD)
    assert install(sqlite_project, "--user", cron_user.name).returncode == 0
    before = cron_user.crontab()
    target = sqlite_project.dir / "crontab.d" / f"50-{bad.name}"
    target.write_bytes(bad.read_bytes())
    lineno, reason = expectation(bad)

    result = install(sqlite_project, "--user", cron_user.name)

    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{target}:{lineno}: " in result.stderr
    assert reason in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert cron_user.crontab() == before


def install_in_process(*args: str) -> tuple[int, str]:
    """install_crontab's command line run in this process: (exit code, stderr)."""
    from django.core.management import load_command_class

    stdout, stderr = io.StringIO(), io.StringIO()
    command = load_command_class("ops", "install_crontab")
    command.stdout, command.stderr = OutputWrapper(stdout), OutputWrapper(stderr)
    try:
        command.run_from_argv(["manage.py", "install_crontab", *args])
    except SystemExit as exit:
        return int(exit.code or 0), stderr.getvalue()
    return 0, stderr.getvalue()


@pytest.mark.django_db  # install_crontab asks whether cronops' migrations are applied
def test_no_file_of_the_malformed_corpus_changes_an_installed_crontab(
    cron_user, settings, tmp_path
):
    """Every corpus file (tests/data/bad_crontabs) beside a good one: exit 2, one line naming
    its file and line, and the user's real crontab byte-identical. One user and one install
    for all of them, the command run in process (each was a deployed copy, a throwaway user
    and two cold `manage.py` starts: a minute of CPU)."""
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    settings.OPS_CRONTAB_DIR = directory
    settings.OPS_LOG_DIR = tmp_path / "var" / "log"
    settings.OPS_CRONTAB_ID = f"corpus-{cron_user.name}"
    (directory / "10-good.cron").write_text(GOOD)
    assert install_in_process("--user", cron_user.name) == (0, "")
    before = cron_user.crontab()
    assert b"charge_daily" in before

    for bad in CORPUS:
        target = directory / f"50-{bad.name}"
        target.write_bytes(bad.read_bytes())
        lineno, reason = expectation(bad)

        code, stderr = install_in_process("--user", cron_user.name)

        assert code == 2, (bad.name, stderr)
        assert f"{target}:{lineno}: " in stderr, (bad.name, stderr)
        assert reason in stderr, (bad.name, stderr)
        assert len(stderr.strip().splitlines()) == 1, (bad.name, stderr)
        assert cron_user.crontab() == before, bad.name
        target.unlink()


def test_foreign_lines_survive_install_reinstall_change_and_remove_byte_for_byte(
    sqlite_project, cron_user
):
    cron_user.set_crontab(FOREIGN)
    assert cron_user.crontab() == FOREIGN
    sqlite_project.write_cron("10-billing.cron", GOOD)

    first = install(sqlite_project, "--user", cron_user.name)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"installed 1 job: +1 {MINUS}0 ~0"
    installed = cron_user.crontab()
    assert installed.startswith(FOREIGN)  # every foreign byte, in place, block last
    assert installed.endswith(f"# END cronops {sqlite_project.dir}\n".encode())

    again = install(sqlite_project, "--user", cron_user.name)
    assert again.returncode == 0 and again.stdout.strip() == "crontab up to date"
    assert cron_user.crontab() == installed

    sqlite_project.write_cron(
        "10-billing.cron",
        "MAILTO=ops@example.com\n0 4 * * * charge_daily\n@daily --name=clear-sessions "
        "clearsessions\n",
    )
    changed = install(sqlite_project, "--user", cron_user.name)
    assert changed.stdout.strip() == f"installed 2 jobs: +1 {MINUS}0 ~1"
    after_change = cron_user.crontab()
    assert without_block(after_change, sqlite_project) == FOREIGN
    assert b"MAILTO=ops@example.com\n" in our_block(after_change, sqlite_project)

    removed = install(sqlite_project, "--user", cron_user.name, "--remove")
    assert removed.returncode == 0, removed.stderr
    assert cron_user.crontab() == FOREIGN


def test_a_block_that_is_not_last_is_moved_to_the_end_and_foreign_lines_keep_their_order(
    sqlite_project, cron_user
):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    install(sqlite_project, "--user", cron_user.name)
    appended = cron_user.crontab() + b"FOO=bar\n30 2 * * * echo added later by hand\n"
    cron_user.set_crontab(appended)

    result = install(sqlite_project, "--user", cron_user.name)

    assert result.returncode == 0, result.stderr
    data = cron_user.crontab()
    assert data.endswith(our_block(data, sqlite_project))
    assert without_block(data, sqlite_project) == without_block(appended, sqlite_project)


def test_arguments_with_shell_syntax_reach_the_command_literally_and_never_run(
    sqlite_project, tmp_path
):
    add_echo_args(sqlite_project.dir)
    marker = Path(f"/tmp/cronops-pwned-{uuid.uuid4().hex}")
    words = [
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        "100% done, 50%% left, \\%d and a back\\slash",
        'it\'s "quoted"',
        "",
        f"line{LINE_BREAKS_IN_ARGS}breaks",
    ]
    sqlite_project.write_cron(
        "10-echo.cron", "* * * * * --no-ping echo_args " + shlex.join(words) + "\n"
    )
    tab = tmp_path / "tab"
    assert install(sqlite_project, "--tabfile", str(tab)).returncode == 0
    line = next(x for x in tab.read_text().split("\n") if "run_job" in x)  # cron's lines
    command = line.split(None, 5)[5]

    # what Debian's cron hands to /bin/sh: `\%` becomes `%`, an unescaped `%` ends the command
    shell_text = cron_percent(command)
    result = subprocess.run(
        ["/bin/sh", "-c", shell_text],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": "/bin/sh"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stderr
    log = (sqlite_project.dir / "var" / "log" / "echo_args.log").read_text()
    printed = next(x for x in log.splitlines() if x.startswith("ARGS "))
    assert json.loads(printed[5:]) == words
    assert not marker.exists()


def cron_percent(command: str) -> str:
    """Debian cron's do_command: `\\%` → `%`; the first unescaped `%` ends the command."""
    out, escaped = [], False
    for ch in command:
        if escaped:
            if ch == "%":
                out[-1] = "%"
            else:
                out.append(ch)
            escaped = False
            continue
        if ch == "%":
            break
        out.append(ch)
        escaped = ch == "\\"
    return "".join(out)


def test_each_line_cds_into_the_project_and_runs_the_absolute_venv_python_with_a_log(
    sqlite_project, tmp_path
):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    tab = tmp_path / "tab"
    install(sqlite_project, "--tabfile", str(tab))
    import sys

    lines = tab.read_text().splitlines()
    job = next(x for x in lines if "run_job" in x)
    log = sqlite_project.dir / "var" / "log" / "charge_daily.log"
    assert job == (
        f"0 3 * * * cd {sqlite_project.dir} && {sys.executable} {sqlite_project.dir}/manage.py "
        f"run_job --log={log} charge_daily"
    )
    assert "# job charge_daily: Charge every active subscription." in lines
    assert log.parent.is_dir()


def test_dry_run_prints_a_unified_diff_and_changes_nothing(sqlite_project, tmp_path):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    tab = tmp_path / "tab"
    tab.write_bytes(FOREIGN)

    result = install(sqlite_project, "--tabfile", str(tab), "--dry-run")

    assert result.returncode == 0, result.stderr
    assert f"--- {tab} (installed)" in result.stdout
    assert re.search(r"^\+0 3 \* \* \* cd .* run_job --log=\S+ charge_daily$", result.stdout, re.M)
    assert result.stdout.strip().endswith(
        f"would have installed 1 job: +1 {MINUS}0 ~0 (dry run, nothing changed)"
    )
    assert tab.read_bytes() == FOREIGN
    assert not (sqlite_project.dir / "var" / "log").exists()


def test_check_exits_1_when_an_install_would_change_something_and_0_when_not(
    sqlite_project, tmp_path
):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    tab = tmp_path / "tab"

    stale = install(sqlite_project, "--tabfile", str(tab), "--check")
    assert stale.returncode == 1
    assert f"crontab not up to date: would have installed 1 job: +1 {MINUS}0 ~0" in stale.stderr
    assert not tab.exists()

    install(sqlite_project, "--tabfile", str(tab))
    fresh = install(sqlite_project, "--tabfile", str(tab), "--check")
    assert fresh.returncode == 0 and fresh.stdout.strip() == "crontab up to date"


def test_a_time_zone_mismatch_is_refused_with_the_fix_unless_allowed(sqlite_project, cron_user):
    cron_user.set_crontab(FOREIGN)
    sqlite_project.write_cron("10-billing.cron", GOOD)
    sqlite_project.write_env(TIME_ZONE="Europe/Moscow")  # the machine runs Etc/UTC

    refused = install(sqlite_project, "--user", cron_user.name)

    assert refused.returncode == 3
    assert "TIME_ZONE is Europe/Moscow" in refused.stderr
    assert "timedatectl set-timezone Europe/Moscow" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert cron_user.crontab() == FOREIGN

    allowed = install(sqlite_project, "--user", cron_user.name, "--allow-tz-mismatch")
    assert allowed.returncode == 0, allowed.stderr


def test_a_failing_crontab_command_is_reported_and_the_previous_crontab_stays(
    sqlite_project, cron_user, tmp_path
):
    """A `crontab` that can read and check but not write (as with a full disk): a real
    process in front of Debian's, failing only the install step."""
    cron_user.set_crontab(FOREIGN)
    sqlite_project.write_cron("10-billing.cron", GOOD)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "crontab"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in -l|-n|-r) exec /usr/bin/crontab "$@";; esac; done\n'
        'echo "crontab: cannot write spool file: No space left on device" >&2\nexit 1\n'
    )
    wrapper.chmod(0o755)

    result = install(
        sqlite_project, "--user", cron_user.name, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}
    )

    assert result.returncode == 4
    assert "No space left on device" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert cron_user.crontab() == FOREIGN


def test_damaged_markers_of_our_block_are_refused_without_touching_anything(
    sqlite_project, cron_user
):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    damaged = FOREIGN + f"# BEGIN cronops {sqlite_project.dir}\n0 3 * * * echo half\n".encode()
    cron_user.set_crontab(damaged)

    result = install(sqlite_project, "--user", cron_user.name)

    assert result.returncode == 4
    assert "damaged markers" in result.stderr
    assert cron_user.crontab() == damaged


def test_no_secret_reaches_the_crontab_or_the_output(sqlite_project, tmp_path):
    sqlite_project.write_env(HEALTHCHECKS_PING_KEY=PING_KEY)
    sqlite_project.write_cron(
        "10-billing.cron",
        f"0 3 * * * --ping=https://hc-ping.com/{PING_KEY}/charge charge_daily\n",
    )
    tab = tmp_path / "tab"

    result = install(sqlite_project, "--tabfile", str(tab))

    assert result.returncode == 0, result.stderr
    assert PING_KEY not in tab.read_text()
    assert "/charge_daily.log charge_daily\n" in tab.read_text()

    sqlite_project.write_cron("10-billing.cron", f"0 3 * * * charge_daily --x={PING_KEY}\n")
    leaked = install(sqlite_project, "--tabfile", str(tab), "--dry-run")
    assert leaked.returncode == 2
    assert PING_KEY not in leaked.stdout + leaked.stderr
    assert "<redacted HEALTHCHECKS_PING_KEY>" in leaked.stderr


def test_a_secret_written_into_an_argument_is_refused_without_printing_it(sqlite_project, tmp_path):
    add_echo_args(sqlite_project.dir)
    secret = sqlite_project.settings["SECRET_KEY"]
    sqlite_project.write_cron("10-echo.cron", f"0 3 * * * echo_args {secret}\n")
    tab = tmp_path / "tab"

    result = install(sqlite_project, "--tabfile", str(tab))

    assert result.returncode == 2
    assert "contains the value of SECRET_KEY" in result.stderr
    assert secret not in result.stdout + result.stderr
    assert not tab.exists()


def test_root_creates_the_log_directory_for_the_user_it_installs_for(sqlite_project, cron_user):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    log_dir = sqlite_project.dir / "var" / "log"
    assert not log_dir.exists()

    assert install(sqlite_project, "--user", cron_user.name).returncode == 0

    info = log_dir.stat()
    assert stat.S_ISDIR(info.st_mode)
    import pwd

    assert info.st_uid == pwd.getpwnam(cron_user.name).pw_uid
    assert log_dir.parent.stat().st_uid == info.st_uid  # var/ too: run_job makes var/lock


def test_remove_without_a_block_is_a_no_op_and_two_projects_keep_separate_stable_blocks(
    sqlite_project, tmp_path
):
    tab = tmp_path / "tab"
    tab.write_bytes(FOREIGN)
    assert install(sqlite_project, "--tabfile", str(tab), "--remove").stdout.strip() == (
        "crontab up to date"
    )
    sqlite_project.write_cron("10-billing.cron", GOOD)
    install(sqlite_project, "--tabfile", str(tab))
    install(sqlite_project, "--tabfile", str(tab), env={"OPS_CRONTAB_ID": "second"})

    text = tab.read_text()
    assert text.count("# BEGIN cronops ") == 3  # the foreign project's, ours and "second"
    # two projects sharing a crontab keep their places: re-installing either is a no-op
    assert install(sqlite_project, "--tabfile", str(tab)).stdout.strip() == "crontab up to date"
    second = install(sqlite_project, "--tabfile", str(tab), env={"OPS_CRONTAB_ID": "second"})
    assert second.stdout.strip() == "crontab up to date"
    assert tab.read_text() == text
    install(sqlite_project, "--tabfile", str(tab), "--remove")
    install(sqlite_project, "--tabfile", str(tab), "--remove", env={"OPS_CRONTAB_ID": "second"})
    assert tab.read_bytes() == FOREIGN


def test_a_tabfile_keeps_its_mode_and_a_missing_final_newline_gains_exactly_one(
    sqlite_project, tmp_path
):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    tab = tmp_path / "tab"
    tab.write_bytes(b"0 5 * * * echo no final newline")
    os.chmod(tab, 0o640)

    install(sqlite_project, "--tabfile", str(tab))
    install(sqlite_project, "--tabfile", str(tab), "--remove")

    assert tab.read_bytes() == b"0 5 * * * echo no final newline\n"
    assert stat.S_IMODE(tab.stat().st_mode) == 0o640


def test_a_carriage_return_in_a_foreign_line_survives_because_root_reads_the_spool_file(
    sqlite_project, cron_user
):
    """Debian's `crontab -l` shows a CR as the two characters `\\r`; a naive installer would
    write that back and change the line."""
    foreign = FOREIGN + b"0 6 * * * printf 'windows\\r\\n' # and a real CR:\r\n"
    cron_user.set_crontab(foreign)
    sqlite_project.write_cron("10-billing.cron", GOOD)

    assert install(sqlite_project, "--user", cron_user.name).returncode == 0
    spool = Path("/var/spool/cron/crontabs") / cron_user.name
    data = spool.read_bytes()
    assert data[data.index(FOREIGN[:40]) :].startswith(foreign)

    assert install(sqlite_project, "--user", cron_user.name, "--remove").returncode == 0
    data = spool.read_bytes()
    assert data.endswith(foreign)


def test_a_tab_file_with_lines_cron_would_refuse_keeps_them_and_gets_only_our_block_checked(
    sqlite_project, tmp_path
):
    tab = tmp_path / "tab"
    tab.write_bytes(FOREIGN + b"this is not a cron line at all\n")
    sqlite_project.write_cron("10-billing.cron", GOOD)

    result = install(sqlite_project, "--tabfile", str(tab))

    assert result.returncode == 0, result.stderr
    assert without_block(tab.read_bytes(), sqlite_project) == (
        FOREIGN + b"this is not a cron line at all\n"
    )


def test_a_block_with_mailto_moves_below_another_projects_block_so_its_mailto_reaches_no_one_else():
    from ops.schedule.crontab_text import splice

    ours = "# BEGIN cronops a\nMAILTO=ops@example.com\n0 0 * * * true\n# END cronops a\n"
    theirs = "# BEGIN cronops b\n0 1 * * * true\n# END cronops b\n"
    text = splice(splice(splice("", ours, "a"), theirs, "b"), ours, "a")
    assert text == theirs + ours


def test_an_argument_with_a_unicode_line_separator_installs_reinstalls_changes_and_is_removed(
    sqlite_project, cron_user
):
    """An argument containing U+2028 installed once, then every later install or --remove
    failed with "damaged markers" (or missed a change after the U+2028): the installer cut
    the crontab with str.splitlines(), which also cuts there."""
    add_echo_args(sqlite_project.dir)
    foreign = FOREIGN + f"0 6 * * * echo 'kept{ODD_BREAKS}as is'\n".encode()
    cron_user.set_crontab(foreign)
    odd = LINE_BREAKS_IN_ARGS
    # quoted and bare, one word each; the second looks like our END marker after the U+2028
    args = [f"a{odd}b", f"see{odd}# END cronops {sqlite_project.dir} here", f"c{odd}d"]

    def schedule(at: str, last: str) -> str:
        return f"# Echo{odd}it.\n{at} echo_args '{args[0]}' '{args[1]}' {last}\n"

    sqlite_project.write_cron("10-echo.cron", schedule("0 3 * * *", args[2]))

    first = install(sqlite_project, "--user", cron_user.name)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"installed 1 job: +1 {MINUS}0 ~0"
    installed = cron_user.crontab()
    assert installed.startswith(foreign)
    assert shlex.join(args).encode() in our_block(installed, sqlite_project)

    again = install(sqlite_project, "--user", cron_user.name)
    assert (again.returncode, again.stdout.strip()) == (0, "crontab up to date"), again.stderr
    assert cron_user.crontab() == installed

    sqlite_project.write_cron("10-echo.cron", schedule("0 3 * * *", f"c{odd}D"))  # after U+2028
    diff = install(sqlite_project, "--user", cron_user.name, "--dry-run")
    assert diff.returncode == 0, diff.stderr
    assert len([x for x in diff.stdout.split("\n") if x.startswith("+0 3 * * *")]) == 1
    changed = install(sqlite_project, "--user", cron_user.name)
    assert changed.stdout.strip() == f"installed 1 job: +0 {MINUS}0 ~1", changed.stderr
    assert without_block(cron_user.crontab(), sqlite_project) == foreign

    removed = install(sqlite_project, "--user", cron_user.name, "--remove")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == f"removed 1 job from the crontab of {cron_user.name}"
    assert cron_user.crontab() == foreign


def test_mailto_empty_installs_as_mailto_quoted_empty_which_debian_cron_reads_as_no_mail(
    sqlite_project, cron_user
):
    """`MAILTO=` (crontab.d's "no mail") was rendered bare, and Debian's crontab refused the
    whole text ("line 1: bad minute")."""
    sqlite_project.write_cron("10-billing.cron", "MAILTO=\n" + GOOD)

    result = install(sqlite_project, "--user", cron_user.name)

    assert result.returncode == 0, result.stderr
    lines = our_block(cron_user.crontab(), sqlite_project).decode().split("\n")
    assert lines[1] == 'MAILTO=""'


def test_a_line_of_the_existing_crontab_that_crontab_refuses_is_named_and_nothing_changes(
    sqlite_project, cron_user
):
    """A crontab installed by something else (here: written into the spool by root) may hold
    a line today's `crontab -n` refuses: the message names that line, exit 4."""
    cron_user.set_crontab(b"0 5 * * * true\n")
    spool = Path("/var/spool/cron/crontabs") / cron_user.name
    spool.write_bytes(spool.read_bytes() + b"# a comment\n61 * * * * echo bad minute\n")
    before = cron_user.crontab()
    sqlite_project.write_cron("10-billing.cron", GOOD)

    result = install(sqlite_project, "--user", cron_user.name)

    assert result.returncode == 4, result.stderr
    assert "the existing crontab's line 3 (bad minute)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert cron_user.crontab() == before
