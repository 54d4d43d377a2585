"""The project served as a user serves it, and a headless Chromium to look at it.

`Server` runs `manage.py runserver` in a deployed copy with DEBUG off (its default) after
`collectstatic`, the way the deploy leaves it: static files then reach the browser only through
the project's own WhiteNoise middleware, never through a test helper. Chromium is Debian's
(`/usr/bin/chromium`), driven by Playwright; Playwright's own browser download is never used.
Used by tests/test_jobs_page_browser.py and docs/screenshots.py.
"""

import contextlib
import http.client
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_until

CHROMIUM = os.environ.get("CRONOPS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_browser() -> None:
    """Debian's chromium and playwright, or the test is skipped (a failure in CI)."""
    from tests.conftest import require

    require(os.path.exists(CHROMIUM), f"chromium not found at {CHROMIUM} (apt install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        require(False, "playwright not installed (pip install -e '.[dev]')")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(directory: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)}: {result.stderr}"
    return result


class Server:
    """`manage.py runserver 127.0.0.1:PORT --noreload` with DEBUG off, started and stopped."""

    def __init__(self, directory: Path, env: dict):
        self.directory, self.env = directory, dict(env)
        self.env["DEBUG"] = "0"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def prepare(self, user: str, password: str) -> None:
        """What a deploy does before the web server starts: migrate, collectstatic; and a
        staff account (createsuperuser --noinput reads the password from the environment)."""
        manage(self.directory, self.env, "migrate", "-v0")
        manage(self.directory, self.env, "collectstatic", "--noinput", "-v0")
        env = dict(self.env, DJANGO_SUPERUSER_PASSWORD=password)
        manage(
            self.directory, env, "createsuperuser", "--noinput", "--username", user,
            "--email", f"{user}@example.com",
        )  # fmt: skip

    def start(self) -> "Server":
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
            cwd=self.directory,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

        def answers():  # runserver runs the system checks first
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/admin/login/")
                return conn.getresponse().status == 200
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"runserver exited: {self.proc.stderr.read()}") from None
                return False

        wait_until(answers, f"runserver to answer on 127.0.0.1:{self.port}", 60)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@contextlib.contextmanager
def chromium_page(profile: Path, width: int = 1600, height: int = 900):
    """A page in a fresh headless Chromium profile."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        context.set_default_timeout(20_000)
        try:
            yield context.new_page()
        finally:
            context.close()


def log_in(page, base: str, user: str, password: str) -> None:
    page.goto(base + "/admin/login/?next=/admin/")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")


def style(page, selector: str, prop: str = "backgroundColor") -> str:
    return page.eval_on_selector(selector, f"e => getComputedStyle(e).{prop}")


def rgb(hex_colour: str) -> str:
    """'#1a7f37' -> 'rgb(26, 127, 55)', as getComputedStyle reports a colour."""
    value = hex_colour.lstrip("#")
    r, g, b = (int(value[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgb({r}, {g}, {b})"
