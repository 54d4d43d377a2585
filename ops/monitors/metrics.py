"""job_status as Prometheus text exposition, for node_exporter's textfile collector.

The figures come from `status.collect()` (the same report as the table and the JSON), one
gauge family per figure, labelled `job_name` (not `job`: Prometheus gives every scraped series
its target's own `job` label and renames a clashing `job` label of the file `exported_job`).
Samples carry no timestamps (the textfile collector refuses them) and a job without a value
(never succeeded, no schedule) simply has no sample: an absent series is what PromQL's
`absent()` and the `state` gauge are for.

The file is written atomically (a temporary file in the same directory, then `rename`), because
node_exporter reads whatever is there at scrape time, half-written or not.
"""

import datetime as dt
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from .status import STATES, JobStatus, Report

PREFIX = "cronops_job_"
# The job's label. `job` and `instance` are the scrape target's own labels in Prometheus.
LABEL = "job_name"


def _timestamp(value: dt.datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _last_success_at(s: JobStatus) -> float | None:
    run = s.last_success
    if run is None:
        return None
    return _timestamp(run.finished_at or run.started_at)


def _last_exit_code(s: JobStatus) -> float | None:
    run = s.last_run
    return None if run is None or run.exit_code is None else run.exit_code


# (name without prefix, help text, value of one job or None for no sample)
GAUGES: tuple[tuple[str, str, Callable[[JobStatus], float | None]], ...] = (
    (
        "last_success_timestamp_seconds",
        "When the job's last successful run finished (Unix time).",
        _last_success_at,
    ),
    (
        "last_run_timestamp_seconds",
        "When the job's last attempt started (Unix time); skips are not attempts.",
        lambda s: _timestamp(s.last_run.started_at) if s.last_run else None,
    ),
    (
        "last_duration_seconds",
        "How long the job's last finished attempt took.",
        lambda s: s.last_duration,
    ),
    (
        "last_exit_code",
        "Exit code of the job's last attempt (absent while it runs).",
        _last_exit_code,
    ),
    (
        "consecutive_failures",
        "Failed attempts of the job since its last success.",
        lambda s: s.consecutive_failures,
    ),
    (
        "next_fire_timestamp_seconds",
        "The job's next scheduled fire time (Unix time); absent without a schedule.",
        lambda s: _timestamp(s.next_fire),
    ),
    (
        "paused_since_timestamp_seconds",
        "When the job's pause began (Unix time); absent unless it is paused.",
        lambda s: _timestamp(s.pause.since) if s.pause else None,
    ),
    (
        "paused_until_timestamp_seconds",
        "When the job's pause ends by itself (Unix time); absent without --until.",
        lambda s: _timestamp(s.pause.until) if s.pause else None,
    ),
)


def _label(value: str) -> str:
    """A label value escaped as the text format wants: backslash, double quote, newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _family(name: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{{{labels}}} {_number(value)}" for labels, value in samples]
    return lines


def render(report: Report) -> str:
    """The report as text exposition format 0.0.4 (what node_exporter's textfile reads)."""
    lines: list[str] = []
    jobs = report.jobs
    lines += _family(
        PREFIX + "state",
        "1 for the job's current state (as job_status shows it), 0 for the others.",
        (
            (f'{LABEL}="{_label(s.job)}",state="{_label(state)}"', 1 if s.state == state else 0)
            for s in jobs
            for state in STATES
        ),
    )
    for suffix, help_text, value_of in GAUGES:
        samples = []
        for s in jobs:
            value = value_of(s)
            if value is not None:
                samples.append((f'{LABEL}="{_label(s.job)}"', value))
        lines += _family(PREFIX + suffix, help_text, samples)
    lines += _family(
        PREFIX + "paused",
        "1 while the job is paused, labelled with who paused it and why; absent otherwise.",
        (
            (
                f'{LABEL}="{_label(s.job)}",paused_by="{_label(s.pause.paused_by)}",'
                f'reason="{_label(s.pause.reason)}"',
                1,
            )
            for s in jobs
            if s.pause is not None
        ),
    )
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, mode 0644 (node_exporter runs as another user).

    The temporary file starts with a dot and does not end in `.prom`, so the textfile collector
    never reads it; `os.replace` swaps the whole file in one step.
    """
    path = Path(path)
    directory = path.parent
    try:
        directory.mkdir(parents=True)
    except FileExistsError:
        pass  # a directory, or a file in the way: mkstemp then says "Not a directory"
    else:
        # mkdir's mode is masked by the umask (077 under a hardened cron or systemd unit):
        # node_exporter's user must be able to enter the directory to read the 0644 file.
        os.chmod(directory, 0o755)  # noqa: S103 (meant: another user reads the file)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o644)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
