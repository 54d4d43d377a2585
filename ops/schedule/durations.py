"""Durations as operators write them: 90s, 30m, 2h, 7d (a bare number is seconds)."""

import math
import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# ASCII digits only: `\d` would take full-width and other Unicode digits, which an operator
# cannot tell apart from their ASCII look-alikes in a crontab or a log.
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)")


def parse_duration(text: str, maximum: float | None = None) -> float:
    """Seconds in `text`, at most `maximum`; ValueError naming the accepted forms otherwise."""
    match = _DURATION.fullmatch(text.strip(" \t"))
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"] if match else 0.0
    shown = repr(text) if len(text) <= 40 else repr(text[:30]) + "…"
    if not (0 < seconds < math.inf):
        raise ValueError(
            f"bad duration {shown}: use a positive number with s, m, h or d (90s, 30m, 2h)"
        )
    if maximum is not None and seconds > maximum:
        raise ValueError(f"bad duration {shown}: at most {format_duration(maximum)}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= UNITS[unit] and seconds % UNITS[unit] == 0:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{seconds:g}s"


def human_duration(seconds: float | None) -> str:
    """A measured duration for people: 850ms, 4.2s, 12m, 1.5h ("" for None)."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m".replace(".0m", "m")
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h".replace(".0h", "h")
    return f"{seconds / 86400:.1f}d".replace(".0d", "d")
