"""P1/P2: the cost of run_job around a command.

Alternates, in one process tree, N rounds of:
  bare     python manage.py bench_noop                 (prints "ok"; never opens the database)
  run_job  python manage.py run_job --force bench_noop   (lock, slot claim, start + success pings)
  bare_db  python manage.py bench_query                (one query: what a real job does at least)
  run_db   python manage.py run_job --force bench_query
  recipe   flock -n LOCK python manage.py bench_noop && curl -fsS -m 10 --retry 5 URL
and prints medians, ratios and peak memory. Usage: python bench/bench_runner.py [ROUNDS]
"""

import shutil
import sys

from _common import PingServer, deployed_copy, median, timed

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 21


def main() -> None:
    root = deployed_copy("* * * * * bench_noop\n* * * * * bench_query\n")
    server = PingServer()
    ping_env = {"HEALTHCHECKS_PING_URL": server.url, "HEALTHCHECKS_PING_KEY": "benchkey"}
    py, manage = sys.executable, str(root / "manage.py")
    lock = root / "var" / "recipe.lock"
    variants = {
        "bare": ([py, manage, "bench_noop"], False),
        "run_job": ([py, manage, "run_job", "--force", "bench_noop"], False),
        "bare_db": ([py, manage, "bench_query"], False),
        "run_db": ([py, manage, "run_job", "--force", "bench_query"], False),
        "recipe": (
            f"flock -n {lock} {py} {manage} bench_noop && "
            f"curl -fsS -m 10 --retry 5 {server.url}benchkey/bench_noop >/dev/null",
            True,
        ),
    }
    if not shutil.which("curl") or not shutil.which("flock"):
        del variants["recipe"]
    results = {name: ([], []) for name in variants}
    for _ in range(2):  # warm the page cache and the .pyc files
        for argv, shell in variants.values():
            timed(argv, cwd=root, extra_env=ping_env, shell=shell)
    for _ in range(ROUNDS):
        for name, (argv, shell) in variants.items():
            wall, rss, code = timed(argv, cwd=root, extra_env=ping_env, shell=shell)
            assert code == 0, f"{name} exited {code}"
            results[name][0].append(wall)
            results[name][1].append(rss)
    server.close()
    bare_wall, bare_rss = median(results["bare"][0]), max(results["bare"][1])
    print(f"rounds: {ROUNDS} (alternating), python {sys.version.split()[0]}")
    for name, (walls, rsss) in results.items():
        print(
            f"{name:8} median wall {median(walls) * 1000:7.1f} ms   ratio to bare "
            f"{median(walls) / bare_wall:5.3f}   peak RSS {max(rsss) / 1024:6.1f} MiB "
            f"({(max(rsss) - bare_rss) / 1024:+.1f})"
        )
    p1 = median(results["run_job"][0]) / bare_wall
    print(
        f"P1 run_job/bare wall ratio {p1:.3f} (goal <= 1.10): {'met' if p1 <= 1.10 else 'NOT met'}"
    )
    p1db = median(results["run_db"][0]) / median(results["bare_db"][0])
    print(
        f"P1 (job using the database) run_job/bare ratio {p1db:.3f} (goal <= 1.10): "
        f"{'met' if p1db <= 1.10 else 'NOT met'}"
    )
    mem = (max(results["run_job"][1]) - bare_rss) / 1024
    print(f"P1 peak memory delta {mem:+.1f} MiB (goal <= 10): {'met' if mem <= 10 else 'NOT met'}")
    if "recipe" in results:
        p2 = median(results["run_job"][0]) / median(results["recipe"][0])
        print(
            f"P2 run_job/recipe wall ratio {p2:.3f} (goal <= 1.0): "
            f"{'met' if p2 <= 1.0 else 'NOT met'}"
        )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
