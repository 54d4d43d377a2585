"""Django settings for the cronops project.

Everything a deploy changes comes from the environment or from `.env` beside manage.py
(cron's environment is bare, so the file is loaded here, by every process).
"""

import os
import socket
from pathlib import Path

import dj_database_url
from dotenv import load_dotenv

BASE_DIR = Path(__file__).resolve().parent.parent

# The real environment wins over .env, so a deploy (or a test) can override one value.
load_dotenv(BASE_DIR / ".env", override=False)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name, "")
    if not value:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name, "")
    path = Path(value) if value else default
    return path if path.is_absolute() else BASE_DIR / path


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
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
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

VAR_DIR = env_path("OPS_VAR_DIR", BASE_DIR / "var")
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
STATIC_ROOT = VAR_DIR / "static"

# cronops (see README, "Settings")
OPS_CRONTAB_DIR = env_path("OPS_CRONTAB_DIR", BASE_DIR / "crontab.d")
OPS_LOCK_DIR = env_path("OPS_LOCK_DIR", VAR_DIR / "lock")
OPS_LOG_DIR = env_path("OPS_LOG_DIR", VAR_DIR / "log")
OPS_HOST = os.environ.get("OPS_HOST") or socket.gethostname()
OPS_CRONTAB_ID = os.environ.get("OPS_CRONTAB_ID") or ""
OPS_HEARTBEAT_SECONDS = float(os.environ.get("OPS_HEARTBEAT_SECONDS") or 30)
OPS_PING_BUDGET_SECONDS = float(os.environ.get("OPS_PING_BUDGET_SECONDS") or 10)
# How late a slot may succeed before job_status calls it overdue, for jobs without --timeout.
OPS_DEFAULT_GRACE = os.environ.get("OPS_DEFAULT_GRACE") or "1h"
# The healthchecks.io tag that names this project's checks (default: cronops-<directory>).
OPS_HC_TAG = os.environ.get("OPS_HC_TAG") or ""

HEALTHCHECKS_PING_URL = os.environ.get("HEALTHCHECKS_PING_URL") or "https://hc-ping.com/"
HEALTHCHECKS_PING_KEY = os.environ.get("HEALTHCHECKS_PING_KEY") or ""
HEALTHCHECKS_AUTO_CREATE = env_bool("HEALTHCHECKS_AUTO_CREATE")
HEALTHCHECKS_API_URL = os.environ.get("HEALTHCHECKS_API_URL") or "https://healthchecks.io/api/v3/"
HEALTHCHECKS_API_KEY = os.environ.get("HEALTHCHECKS_API_KEY") or ""
HEALTHCHECKS_CHANNELS = os.environ.get("HEALTHCHECKS_CHANNELS") or "*"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "cronops: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"ops": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}
