"""What the healthchecks server will make of a job's pings, as sync_healthchecks sees its check.

- "Filter by HTTP body" (`filter_http_body` in the API's listing): the server then decides
  every ping by keywords in its body, whatever its URL says (hc/api/views.py, `ping`): a
  failure keyword → failure, else a success keyword → success, else a start keyword → start,
  else a failure with `filter_default_fail`, else ignored. Keywords are comma-separated and
  matched as substrings. cronops sends the end of the output (the server keeps the first
  `Ping-Body-Limit` bytes of a body, so cronops cuts it itself) and an empty `/start`.
"""


def keywords(value: str | None) -> list[str]:
    """The server's keyword list: comma-separated, blanks dropped."""
    return [k.strip() for k in (value or "").split(",") if k.strip()]


def filter_warning(check: dict) -> str | None:
    """One line saying what the check's body filter does to the job's pings, or None."""
    if not check.get("filter_http_body"):
        return None
    failure, success, start = (
        ", ".join(map(repr, keywords(check.get(k))))
        for k in ("failure_kw", "success_kw", "start_kw")
    )
    default_fail = bool(check.get("filter_default_fail"))
    rules = [
        f"{kw} → {what}"
        for kw, what in ((failure, "failure"), (success, "success"), (start, "start"))
        if kw
    ]
    other = "failure" if default_fail else "ignored"
    rules.append(
        f"anything else → {other}" if rules else f"no keyword is set: every ping → {other}"
    )
    effects = []
    if success:
        effects.append(f"a failed run whose output has {success} counts as a success")
    if default_fail:
        effects.append("the empty /start is a failure, so every run alerts")
    else:
        effects.append(
            "a run whose output has no keyword changes nothing (a failure never alerts, a "
            "success never counts)"
        )
        effects.append("the empty /start is ignored (no duration)")
    if failure or success:
        effects.append(
            "only the end of the output is sent: a keyword printed before it is cut away"
        )
    slug = check.get("slug") or ""
    return (
        f"warning: check {check.get('name') or slug!r} ({slug}) filters by HTTP body: a ping's "
        f"body decides what it is, not its exit status ({'; '.join(rules)}): "
        f"{'; '.join(effects)}. Turn keyword filtering of HTTP bodies off in the check's "
        "Filtering Rules (or set filter_http_body to false through the API) to keep the exit "
        "status authoritative"
    )
