"""Whether the database has cronops' tables: `manage.py migrate` forgotten (or not run after an
upgrade of cronops).

Two ways to know, for two kinds of caller:

- `unapplied(alias)` asks the database (the migration recorder): for the system check
  `ops.E012`, which runs only under `check --database` (Django's convention for checks that
  query), and for `install_crontab`, which refuses to install lines that would all fail.
- `problem(error)` reads a database error a command already got: only on that error's path, no
  query, no import beyond this module. A missing table is SQLite's `no such table: ops_…`,
  PostgreSQL's SQLSTATE 42P01 (undefined_table, whatever the server's language); a missing
  column (an upgrade not migrated) `no such column` / `has no column named`, SQLSTATE 42703.
  Anything else (a server that is down, a lock, a permission) is not this.
"""

from __future__ import annotations

import re

MISSING = "missing"
OUT_OF_DATE = "out of date"

# Compiled at their first use (an error's path), by re's cache: not by every run_job.
_OURS = r"\bops_"
_SQLITE_TABLE = r"no such table: ops_"
_SQLITE_COLUMN = r"no such column: ops_\w+\.|table ops_\w+ has no column"


def migrate_command(alias: str) -> str:
    return "manage.py migrate" if alias == "default" else f"manage.py migrate --database={alias}"


def quoted(connection, model, *fields: str) -> list[str]:
    """`model`'s table, then the columns of `fields`, quoted for `connection`: the names of a
    statement written out (a question every fire asks, where the ORM costs ~3 M instructions
    a query)."""
    q, meta = connection.ops.quote_name, model._meta
    columns = [meta.pk.column if f == "pk" else meta.get_field(f).column for f in fields]
    return [q(meta.db_table), *(q(column) for column in columns)]


def ops_alias() -> str:
    """The database cronops' runs write to (a project's router may put them elsewhere)."""
    from django.db import router

    from .models import SlotClaim

    return router.db_for_write(SlotClaim)


def problem(error: BaseException) -> str | None:
    """MISSING, OUT_OF_DATE, or None when `error` is not about cronops' tables."""
    text = str(error)
    cause = error.__cause__ or error
    code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    ours = re.search(_OURS, text) is not None  # ops_jobrun, not shops_order
    if code == "42P01" or re.search(_SQLITE_TABLE, text):
        return MISSING if ours else None
    if code == "42703" or re.search(_SQLITE_COLUMN, text):
        return OUT_OF_DATE if ours else None
    return None


def not_applied(pending: list[str], alias: str) -> str:
    verb = "is" if len(pending) == 1 else "are"
    return f"{len(pending)} of cronops' migrations {verb} not applied to database {alias!r}"


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def explained(error: BaseException) -> str | None:
    """The one line for a database error that says cronops' tables are missing or older than
    its code (ending with what to run), else None."""
    kind = problem(error)
    if kind is None:
        return None
    alias = ops_alias()
    run = f"(run `{migrate_command(alias)}`)"
    if kind == MISSING:
        return f"cronops' tables are missing from database {alias!r} {run}"
    why = first_line(error)
    return f"cronops' tables in database {alias!r} are older than its code ({why}) {run}"


def database_error_line(error: BaseException) -> str:
    """`explained(error)`, else the database's own first line."""
    return explained(error) or first_line(error)


def unapplied(alias: str) -> list[str]:
    """cronops' migrations not applied to database `alias`, in the order migrate applies them
    (`ops.0001_initial`, …). Queries the database: DatabaseError when it cannot be read."""
    from django.db import connections
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    graph, applied = loader.graph, loader.applied_migrations
    pending: list[str] = []
    for leaf in graph.leaf_nodes("ops"):
        for app, name in graph.forwards_plan(leaf):
            key = f"{app}.{name}"
            if app == "ops" and (app, name) not in applied and key not in pending:
                pending.append(key)
    return pending


def spelled(pending: list[str]) -> str:
    """`ops.0001_initial … ops.0010_run_task_result`, or the one name."""
    return pending[0] if len(pending) == 1 else f"{pending[0]} … {pending[-1]}"
