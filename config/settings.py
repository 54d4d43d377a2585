"""Django settings of the example project: what an adopter's settings need for cronops.

cronops itself needs two things here: "ops" in INSTALLED_APPS and the `load_env` line (cron's
environment is bare, so `.env` beside manage.py is loaded by every process, cron's included).
Every cronops setting (OPS_*, HEALTHCHECKS_*) has a default and is read from the environment
when it is not a setting (ops/conf.py, docs/settings.md): none is repeated below. The rest is
this example's own: a database from DATABASE_URL, SQLite tuned for many cron processes, and
WhiteNoise for the admin's static files.
"""

import os
from pathlib import Path

import dj_database_url
import django

from ops.env import load_env

BASE_DIR = Path(__file__).resolve().parent.parent

# The real environment wins over .env, and `$` or `${` in a value is kept as written.
load_env(BASE_DIR / ".env")


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name, "")
    if not value:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


# A random key per process would break admin sessions; an explicit one comes from .env.
SECRET_KEY = os.environ.get("SECRET_KEY") or "insecure-dev-key-set-SECRET_KEY-in-.env"
DEBUG = env_bool("DEBUG")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ops",
    "commands",
    # Django Tasks (docs/tasks.md): the example's scheduled task (commands/tasks.py) is enqueued
    # on django-tasks-db's database backend and run by its worker (`manage.py db_worker`).
    *(["django_tasks"] if django.VERSION < (6, 0) else []),  # the backport, on Django 5.2
    "django_tasks_db",
]

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS) from STATIC_ROOT, filled by `collectstatic` at deploy:
    # Django itself serves them only with DEBUG on, and nothing else here is a web server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# OPS_VAR_DIR is also where cronops keeps its lock and log directories by default.
VAR_DIR = BASE_DIR / (os.environ.get("OPS_VAR_DIR") or "var")
SQLITE_DEFAULT = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(os.environ.get("DATABASE_URL") or SQLITE_DEFAULT)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Many cron processes share one file: WAL lets readers run beside a writer, the busy
    # timeout waits for the lock instead of failing, and IMMEDIATE takes the write lock at
    # BEGIN so two writers never deadlock on an upgrade ("database is locked").
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("OPS_TEST_SQLITE") or None}
    _db_name = DATABASES["default"]["NAME"]
    if _db_name and _db_name != ":memory:":
        # SQLite creates the file but not its folder; a fresh checkout has no var/ yet.
        Path(_db_name).parent.mkdir(mode=0o750, parents=True, exist_ok=True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE") or "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"  # `manage.py collectstatic` (the deploy runs it)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "cronops: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"ops": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}
