"""P1/P2: the cost of run_job around a command.

Alternates, in one process tree, N rounds of:
  bare     python manage.py bench_noop                 (prints "ok"; never opens the database)
  run_job  python manage.py run_job --force bench_noop   (lock, slot claim, start + success pings)
  bare_db  python manage.py bench_query                (one query: what a real job does at least)
  run_db   python manage.py run_job --force bench_query
  recipe   flock -n LOCK python manage.py bench_noop && curl -fsS -m 10 --retry 5 URL
and prints medians, ratios and peak memory; also CPU time (user + system, which the load of a
shared machine hardly moves) and the median of per-round ratios, to read noisy wall figures by.
The bare commands run Django's system checks (every command does by default; run_job skips
them), so part of run_job's own work is paid for by what it does not do.
Usage: python bench/bench_runner.py [ROUNDS]
"""

import shutil
import sys

from _common import PingServer, deployed_copy, goal, median, timed_cpu

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 31


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
    results = {name: ([], [], []) for name in variants}
    for _ in range(2):  # warm the page cache and the .pyc files
        for argv, shell in variants.values():
            timed_cpu(argv, cwd=root, extra_env=ping_env, shell=shell)
    for r in range(ROUNDS):
        order = list(variants.items())
        for name, (argv, shell) in order if r % 2 else reversed(order):
            wall, rss, code, cpu = timed_cpu(argv, cwd=root, extra_env=ping_env, shell=shell)
            assert code == 0, f"{name} exited {code}"
            results[name][0].append(wall)
            results[name][1].append(rss)
            results[name][2].append(cpu)
    server.close()
    bare_wall, bare_rss = median(results["bare"][0]), max(results["bare"][1])
    bare_cpu = median(results["bare"][2])
    print(f"rounds: {ROUNDS} (alternating, the order reversed every other round)")
    for name, (walls, rsss, cpus) in results.items():
        print(
            f"{name:8} median wall {median(walls) * 1000:6.1f} ms (ratio to bare "
            f"{median(walls) / bare_wall:5.3f})  CPU {median(cpus) * 1000:6.1f} ms (ratio "
            f"{median(cpus) / bare_cpu:5.3f})  peak RSS {max(rsss) / 1024:5.1f} MiB "
            f"({(max(rsss) - bare_rss) / 1024:+.1f})"
        )

    def paired(a, b):
        """Median of the per-round ratios a/b (runs next to each other share the load)."""
        return median([x / y for x, y in zip(results[a][0], results[b][0], strict=True)])

    def cpu(a, b):
        return median(results[a][2]) / median(results[b][2])

    p1 = median(results["run_job"][0]) / bare_wall
    print(
        f"run_job/bare: paired median ratio {paired('run_job', 'bare'):.3f}, CPU ratio "
        f"{cpu('run_job', 'bare'):.3f}"
    )
    goal("P1", f"run_job/bare median wall ratio {p1:.3f} (goal <= 1.10)", p1 <= 1.10)
    p1db = median(results["run_db"][0]) / median(results["bare_db"][0])
    print(
        f"run_db/bare_db: paired median ratio {paired('run_db', 'bare_db'):.3f}, CPU ratio "
        f"{cpu('run_db', 'bare_db'):.3f}"
    )
    goal(
        "P1",
        f"(a job using the database) run_job/bare median wall ratio {p1db:.3f} (goal <= 1.10)",
        p1db <= 1.10,
    )
    mem = (max(results["run_job"][1]) - bare_rss) / 1024
    goal("P1", f"peak memory delta {mem:+.1f} MiB (goal <= 10)", mem <= 10)
    if "recipe" in results:
        p2 = median(results["run_job"][0]) / median(results["recipe"][0])
        print(
            f"run_job/recipe: paired median ratio {paired('run_job', 'recipe'):.3f}, CPU ratio "
            f"{cpu('run_job', 'recipe'):.3f}"
        )
        goal("P2", f"run_job/recipe median wall ratio {p2:.3f} (goal <= 1.0)", p2 <= 1.0)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
