"""The adversary's scenario of issue 20: a holder frozen after (or inside) its charge, and a
standby on another machine that takes the slot over and runs the job again.

Two servers, each a deployed copy in a network namespace and a pid namespace of its own
(tests/netns.py), share one PostgreSQL; heartbeats every second. The job charges once per slot
as docs/several-servers.md says: inside one transaction, fenced (`still_held(lock=True)`) and
marked (`ops.once`). The holder is frozen with SIGSTOP (run_job and its job: two processes)
after its commit, or before it. Fencing alone lets the standby charge again (issue 20, item
1); with `once()` the charge happens exactly once.
"""

import signal
import urllib.parse

import pytest

from .conftest import DAILY, DAILY_DATE, Project, copy_tree, require, wait_for_line, wait_until
from .netns import Network, available
from .test_standby_hosts import Server, freeze

HEARTBEAT = 1
# Charges the slot (a row without a unique constraint of its own), as the docs' recipe says;
# with `fencing-only` in its directory, without once(). `hold-inside` / `hold` in its directory
# keep it inside its transaction / after its commit, for at most two minutes.
CHARGE = """
from django.conf import settings
from django.db import transaction
from commands.models import Subscription
from ops import conf, once
from ops.claims import current_claim

def held(name):
    deadline = time.monotonic() + 120
    while (settings.BASE_DIR / name).exists() and time.monotonic() < deadline:
        time.sleep(0.05)

claim = current_claim()
marked = not (settings.BASE_DIR / "fencing-only").exists()
with transaction.atomic():
    if not claim.still_held(lock=True):
        raise CommandError("another server took this slot over", returncode=75)
    if not marked or once("charge"):
        Subscription.objects.create(customer=f"{conf.host()} {claim.slot}", price=1)
        print("charging", flush=True)
        held("hold-inside")
    else:
        print("already charged", flush=True)
print("committed", flush=True)
held("hold")
"""


@pytest.fixture
def two_servers(pg_project, tmp_path, request):
    reason = available()
    require(not reason, reason)
    # A frozen holder's transaction is ended by the server (docs/several-servers.md).
    name = pg_project.db.url.rsplit("/", 1)[1]
    pg_project.db.execute(
        f"ALTER DATABASE \"{name}\" SET idle_in_transaction_session_timeout = '3s'"
    )
    network = Network()
    request.addfinalizer(network.close)
    db_url = urllib.parse.urlsplit(pg_project.db.url)
    made = []
    for _ in range(2):
        host = network.add_host()
        address, port = host.forward(db_url.hostname, db_url.port)
        url = pg_project.db.url.replace(db_url.netloc, f"{db_url.username}@{address}:{port}")
        copy = Project(copy_tree(tmp_path / host.name), pg_project.db, dict(pg_project.settings))
        copy.write_env(DATABASE_URL=url, OPS_HOST=host.name, OPS_HEARTBEAT_SECONDS=HEARTBEAT)
        copy.add_command("t_job", CHARGE)
        copy.write_cron("t.cron", f"{DAILY} --standby t_job\n")
        made.append(Server(copy, host, tmp_path / "unused"))
    yield made
    for server in made:
        server.kill()


def charges(db) -> list[str]:
    return [row[0] for row in db.query("SELECT customer FROM commands_subscription ORDER BY id")]


def claim(db) -> tuple:
    [row] = db.query("SELECT state, version, host FROM ops_slotclaim")
    return row


@pytest.mark.parametrize("marked", [True, False], ids=["with once", "fencing alone"])
def test_a_holder_frozen_after_its_commit_is_taken_over_and_the_charge_happens_once(
    two_servers, marked
):
    holder, standby = two_servers
    db = holder.project.db
    if not marked:
        for server in two_servers:
            (server.project.dir / "fencing-only").touch()
    (holder.project.dir / "hold").touch()
    holder.start()
    wait_for_line(holder.proc, "committed", timeout=60)
    freeze(holder.pid, signal.SIGSTOP)  # its VM stalls: run_job and its job
    try:
        code, out, err = standby.start().wait(timeout=120)
        assert code == 0, out + err
        # it took the slot over and ran the job, which found the charge done (or not)
        assert ("already charged" if marked else "charging") in out, out + err
    finally:
        freeze(holder.pid, signal.SIGCONT)
    code, out, err = holder.wait(timeout=120)
    assert code == 75 and "was taken over" in err, out + err
    assert claim(db) == ("succeeded", 2, standby.name)
    [(slot,)] = db.query("SELECT slot FROM ops_slotclaim")
    assert slot == DAILY_DATE.isoformat()  # the slot both servers fired for, whatever the hour
    if marked:
        assert charges(db) == [f"{holder.name} {slot}"]  # once, by the frozen holder
        assert db.query("SELECT key, version FROM ops_effect") == [("charge", 1)]
    else:
        # What the fencing recipe alone did (issue 20): the standby charged again.
        assert charges(db) == [f"{holder.name} {slot}", f"{standby.name} {slot}"]


def test_a_holder_frozen_inside_its_transaction_is_taken_over_and_the_charge_happens_once(
    two_servers,
):
    """The frozen holder's charge is not committed: the server ends its session after
    idle_in_transaction_session_timeout (rolled back), the standby's takeover, which waited for
    that fencing transaction (issue 20, item 2), then charges: once, by the standby."""
    holder, standby = two_servers
    db = holder.project.db
    (holder.project.dir / "hold-inside").touch()
    holder.start()
    wait_for_line(holder.proc, "charging", timeout=60)
    freeze(holder.pid, signal.SIGSTOP)
    try:
        code, out, err = standby.start().wait(timeout=120)
        assert code == 0, out + err
        assert "charging" in out
        wait_until(lambda: claim(db)[0] == "succeeded", "the standby's success")
    finally:
        freeze(holder.pid, signal.SIGCONT)
        (holder.project.dir / "hold-inside").unlink()
    code, out, err = holder.wait(timeout=120)
    assert code == 75, out + err  # its transaction is gone with its session: nothing lands
    [(slot,)] = db.query("SELECT slot FROM ops_slotclaim")
    assert slot == DAILY_DATE.isoformat()  # the slot both servers fired for, whatever the hour
    assert charges(db) == [f"{standby.name} {slot}"]
    assert db.query("SELECT key, version FROM ops_effect") == [("charge", 2)]
    assert claim(db) == ("succeeded", 2, standby.name)
