"""F5: every malformed crontab.d input of the installer's corpus (tests/data/bad_crontabs/,
read in place) is refused with its file:line, and the installed crontab stays byte-identical.

A deployed copy installs a valid crontab.d once into a crontab with foreign lines; then, for
each corpus file, adds it to crontab.d and runs install_crontab again. Twice: into a
`--tabfile`, and (as root, with useradd and Debian's crontab) into the real crontab of a
throwaway user that is removed afterwards. Root's own crontab is never touched.
Must hold: exit 2, one stderr line with `<file>:<line>: ` and the expected reason, and
the crontab's bytes unchanged.
Usage: python bench/faults/f5_bad_crontabs.py
"""

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import _path  # noqa: F401
from _common import REPO, deployed_copy, goal, run

CORPUS = sorted((REPO / "tests" / "data" / "bad_crontabs").glob("*.cron"))
GOOD = "# Charge every active subscription.\n0 3 * * * charge_daily\n"
FOREIGN = b"# someone else's line\nMAILTO=root\n17 * * * * /usr/local/bin/backup --quiet\n"


def expectation(path: Path) -> tuple[int, str]:
    first = path.read_text(encoding="utf-8").split("\n", 1)[0]
    match = re.match(r"^# expect (\d+): (.+)$", first)
    assert match, f"{path.name} lacks its `# expect N: ...` line"
    return int(match.group(1)), match.group(2)


def sweep(root: Path, target_args: list[str], read) -> tuple[int, list[str]]:
    """Install the good crontab.d, then every corpus file in turn; (files refused right, misses)."""
    code, _, err, _ = run(root, "install_crontab", *target_args)
    assert code == 0, err
    before = read()
    right, misses = 0, []
    for bad in CORPUS:
        target = root / "crontab.d" / f"50-{bad.name}"
        target.write_bytes(bad.read_bytes())
        lineno, reason = expectation(bad)
        code, _, err, _ = run(root, "install_crontab", *target_args)
        target.unlink()
        lines = err.strip().splitlines()
        ok = (
            code == 2
            and len(lines) == 1
            and f"{target}:{lineno}: " in lines[0]
            and reason in lines[0]
            and read() == before
        )
        right += ok
        if not ok:
            misses.append(f"{bad.name}: exit {code}, {err.strip()!r}")
    return right, misses


def main() -> int:
    root = deployed_copy()
    (root / "crontab.d" / "bench.cron").unlink()
    (root / "crontab.d" / "10-good.cron").write_text(GOOD)  # sorts before the corpus files
    tab = Path(tempfile.mkdtemp(prefix="cronops-f5-")) / "crontab"
    tab.write_bytes(FOREIGN)
    right, misses = sweep(root, ["--tabfile", str(tab)], tab.read_bytes)
    for miss in misses:
        print("  ", miss)
    goal(
        "F5",
        f"--tabfile: {right}/{len(CORPUS)} malformed inputs refused with file:line, crontab "
        "byte-identical",
        right == len(CORPUS) and len(CORPUS) >= 30,
    )
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("crontab"):
        print("F5 real crontab: skipped (needs root, useradd and Debian's crontab)")
        return 0
    user = f"cronops-f5-{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix=f"{user}-"))
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", user],
        check=True,
    )
    try:
        seed = home / "seed.cron"
        seed.write_bytes(FOREIGN)
        subprocess.run(["crontab", "-u", user, str(seed)], check=True)

        def read():
            return subprocess.run(["crontab", "-l", "-u", user], capture_output=True).stdout

        right, misses = sweep(root, ["--user", user], read)
        for miss in misses:
            print("  ", miss)
        goal(
            "F5",
            f"a throwaway user's crontab: {right}/{len(CORPUS)} refused with file:line, crontab "
            "byte-identical",
            right == len(CORPUS),
        )
    finally:
        subprocess.run(["crontab", "-r", "-u", user], capture_output=True)
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
