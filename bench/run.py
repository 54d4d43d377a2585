"""`make bench` / `make faults`: run every benchmark (P1-P9) or fault scenario (F1-F12), then
print the machine and a summary of every goal (met / NOT met).

    .venv/bin/python bench/run.py bench|faults [--only P4,F2] [--quick]

Each script runs as its own process from bench/ without PYTHONDONTWRITEBYTECODE (the children
must use their .pyc files, or every start-up pays for compiling Django). The full output goes to
the terminal and to var/bench/<suite>-latest.txt. Exit status: 1 if a script crashed; for
`faults` also if any goal is not met (correctness); for `bench` NOT met is reported, not fatal
(timings depend on the machine and its load).
"""

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
GOAL = re.compile(r"^([PF]\d+) (.*): (met|NOT met)$")

SUITES = {
    "bench": [
        ("P1 P2", ["bench_runner.py"], ["bench_runner.py", "5"]),
        ("P3", ["bench_pings.py"], ["bench_pings.py", "--rounds", "3", "--budget", "3"]),
        ("P4", ["bench_stampede.py"], ["bench_stampede.py", "--rounds", "2", "--procs", "20"]),
        ("P5", ["bench_install.py"], ["bench_install.py", "--runs", "2", "--no-write"]),
        (
            "P6",
            ["bench_status.py", "--keep", str(REPO / "var" / "bench" / "status-1m")],
            ["bench_status.py", "--rows", "100000", "--repeat", "3"],
        ),
        ("P7", ["bench_output.py"], ["bench_output.py", "--rounds", "1", "--mib", "256"]),
        (
            "P8",
            ["bench_jobs_page.py"],
            ["bench_jobs_page.py", "--rows", "50000", "--repeat", "3"],
        ),
        ("P9", ["bench_fork.py"], ["bench_fork.py", "--rounds", "5"]),
    ],
    "faults": [
        ("F1", ["faults/f1_sigkill.py"], ["faults/f1_sigkill.py", "--runs", "10"]),
        ("F2", ["faults/f2_ping_server.py"], None),
        ("F3", ["faults/f3_database.py"], None),
        (
            "F4",
            ["faults/f4_sqlite_contention.py"],
            ["faults/f4_sqlite_contention.py", "--rounds", "1"],
        ),
        ("F5", ["faults/f5_bad_crontabs.py"], None),
        ("F6", ["faults/f6_disk.py"], None),
        ("F7", ["faults/f7_clock.py"], None),
        ("F8", ["faults/f8_property.py"], ["faults/f8_property.py", "--quick"]),
        ("F9", ["faults/f9_standby.py"], ["faults/f9_standby.py", "--quick"]),
        ("F10", ["faults/f10_environ.py"], ["faults/f10_environ.py", "--runs", "100"]),
        (
            "F11",
            ["faults/f11_sqlite_writers.py"],
            [
                "faults/f11_sqlite_writers.py",
                "--writer",
                "35",
                "--record-writer",
                "0",
                "--no-bound",
            ],
        ),
        ("F12", ["faults/f12_enqueue.py"], ["faults/f12_enqueue.py", "--quick"]),
    ],
}


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    debian = ""
    if Path("/etc/debian_version").exists():
        debian = "Debian " + Path("/etc/debian_version").read_text().strip()
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs ({cpu}); "
        f"Python {platform.python_version()}; {debian or platform.platform()}; load average "
        f"{os.getloadavg()[0]:.1f}"
    )


def derived(ident: str, output: str) -> list[str]:
    """Goal lines for the two benches that print figures only (bench_install, bench_status)."""
    lines = []
    if ident == "P5":
        for name, first, noop in re.findall(
            r"^\| ([^|]*\(`--(?:tabfile|user)`[^|]*)\| ([\d.]+) s \| ([\d.]+) s \|$", output, re.M
        ):
            name, first, noop = name.strip(), float(first), float(noop)
            lines.append(f"P5 {name}: first install {first:.2f} s (goal < 2 s): " + _v(first < 2))
            lines.append(f"P5 {name}: no-op re-install {noop:.2f} s (goal < 1 s): " + _v(noop < 1))
    if ident == "P6":
        logic = re.search(r"status logic.*?median ([\d.]+) ms", output)
        proc = re.search(r"job_status --json` process.*?median ([\d.]+) ms", output)
        base = re.search(r"\(a bare `manage.py [^`]*` process: median ([\d.]+) ms\)", output)
        rows = re.search(r"history: ([\d,]+) JobRun rows", output)
        if logic:
            ms = float(logic.group(1))
            lines.append(
                f"P6 status logic over {rows.group(1) if rows else '?'} runs: median {ms:.1f} ms "
                "(goal < 500 ms): " + _v(ms < 500)
            )
        if proc:
            ms = float(proc.group(1))
            start = f"; start-up alone {float(base.group(1)):.0f} ms" if base else ""
            lines.append(
                f"P6 whole `job_status --json` process: median {ms:.0f} ms{start} "
                "(goal < 500 ms): " + _v(ms < 500)
            )
    return lines


def _v(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--only", default="", help="comma-separated ids, e.g. P4,F2")
    parser.add_argument("--quick", action="store_true", help="fewer rounds: a smoke run")
    args = parser.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    log_dir = REPO / "var" / "bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{args.suite}-latest.txt", "w")

    def emit(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    emit(f"# {args.suite}: {machine()}")
    summary, crashed = [], []
    for ident, argv, quick in SUITES[args.suite]:
        if only and not only & set(ident.split()):
            continue
        argv = quick if args.quick and quick else argv
        emit(f"\n## {ident}: python bench/{' '.join(argv)}")
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=BENCH,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output = []
        for line in proc.stdout:
            line = line.rstrip("\n")
            output.append(line)
            emit(line)
        proc.wait()
        text = "\n".join(output)
        for line in derived(ident.split()[0], text):
            emit(line)
            output.append(line)
        goals = [m.groups() for m in map(GOAL.match, output) if m]
        summary += goals
        emit(f"({ident}: {time.monotonic() - started:.0f} s, exit {proc.returncode})")
        if proc.returncode or not goals:
            crashed.append(ident)
            summary.append((ident.split()[0], f"script exited {proc.returncode}", "NOT met"))
    emit(f"\n# summary ({args.suite}{', quick' if args.quick else ''}): {machine()}")
    for ident, text, verdict in summary:
        emit(f"{verdict:8} {ident} {text}")
    not_met = [s for s in summary if s[2] != "met"]
    emit(f"{len(summary) - len(not_met)} of {len(summary)} goals met")
    if args.quick and args.suite == "bench":
        emit("(--quick: too few rounds for the timing goals; bench/RESULTS.md has full runs)")
    log.close()
    if crashed or (args.suite == "faults" and not_met):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
