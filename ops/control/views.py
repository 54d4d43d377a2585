"""The jobs page's buttons: Pause, Resume, Run now and Run again (ops/admin.py routes to these).

Each is a GET that shows a confirmation (what will happen, and what the job or slot is doing
now) and a POST from that page with Django's CSRF token that does it. All of them, the
confirmations and the action pages included, are for staff with `ops.run_job`: anyone else
gets 403 (the admin sends anonymous users to its login first).
"""

from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from .. import conf
from ..models import JobAction
from ..schedule.options import logical_date
from . import pauses, runnow
from .until import SPELLINGS, parse_until

PERMISSION = "ops.run_job"


def can_operate(request) -> bool:
    return request.user.has_perm(PERMISSION)


def _allowed(request, name: str):
    """The declared job (None: ad hoc), for a user with the permission; else 403 / 404."""
    if not can_operate(request):
        raise PermissionDenied
    try:
        return pauses.lookup(name)
    except pauses.UnknownJob:
        raise Http404(f"no job named {name!r}") from None


def _page(admin, request, name: str, title: str, **extra) -> TemplateResponse:
    context = {
        **admin.admin_site.each_context(request),
        "opts": admin.opts,
        "title": title,
        "job": name,
        "time_zone": settings.TIME_ZONE,
        **extra,
    }
    return TemplateResponse(request, "admin/ops/job/confirm.html", context)


def _back(name: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("admin:ops_job_detail", args=[name]))


def pause_view(admin, request, name: str):
    job = _allowed(request, name)
    tz, now = ZoneInfo(settings.TIME_ZONE), timezone.now()
    current = pauses.active_pauses([name], now).get(name)
    until, reason, error = request.POST.get("until", ""), request.POST.get("reason", ""), ""
    if request.method == "POST":
        try:
            end = parse_until(until, now, tz) if until.strip() else None
        except ValueError as exc:
            error = str(exc)
        else:
            pause, check = pauses.pause(
                name, job, by=request.user.get_username(), until=end, reason=reason, now=now, tz=tz
            )
            messages.success(request, f"Paused {name} {pauses.describe(pause, tz)}.")
            from ..monitors.monitors import pause_notes  # only then: the admin stays lean

            for note in pause_notes(name, job):
                messages.warning(request, note)
            if check is not None:
                level = messages.SUCCESS if check.ok else messages.ERROR
                messages.add_message(request, level, f"healthchecks.io: {check.note}")
            return _back(name)
    return _page(
        admin,
        request,
        name,
        f"Pause {name}?",
        action="pause",
        state=f"paused {pauses.describe(current, tz)}" if current else "",
        until=until,
        reason=reason,
        error=error,
        spellings=SPELLINGS,
    )


def resume_view(admin, request, name: str):
    job = _allowed(request, name)
    tz, now = ZoneInfo(settings.TIME_ZONE), timezone.now()
    if request.method == "POST":
        ended, check = pauses.resume(name, job, by=request.user.get_username(), now=now, tz=tz)
        text = f"Resumed {name}." if ended else f"{name} was not paused."
        messages.success(request, text)
        from ..monitors.monitors import pause_notes  # only then: the admin stays lean

        for note in pause_notes(name, job, resumed=True) if ended is not None else []:
            messages.info(request, note)
        if check is not None:
            level = messages.SUCCESS if check.ok else messages.ERROR
            messages.add_message(request, level, f"healthchecks.io: {check.note}")
        return _back(name)
    current = pauses.active_pauses([name], now).get(name)
    state = f"paused {pauses.describe(current, tz)}" if current else f"{name} is not paused"
    return _page(admin, request, name, f"Resume {name}?", action="resume", state=state)


def run_view(admin, request, name: str):
    """Run now (no date) or Run again (`date`), optionally with `force`."""
    job = _allowed(request, name)
    if job is None:
        raise Http404(f"{name} is not declared in crontab.d: only a declared job runs from here")

    def asked(key: str) -> str:  # the confirmation's form, else the link's query
        return request.POST.get(key) or request.GET.get(key) or ""

    text, refused = asked("date"), ""
    try:  # run_job's own rules for --logical-date, and its words
        day = logical_date(text) if text else None
    except ValueError as exc:
        day, refused = None, str(exc)
    force = asked("force") == "1"
    tz, now = ZoneInfo(settings.TIME_ZONE), timezone.now()
    if refused:
        state = runnow.SlotState(runnow.INVALID, refused)
    else:
        state = runnow.slot_state(name, job, day, now=now, tz=tz)
    argv = runnow.run_job_argv(name, day, force)
    if refused:  # the command as it was asked for, refused
        argv.insert(2, f"--logical-date={text[:40]}")
    startable = state.kind == runnow.FREE or (state.kind == runnow.DONE and force)
    error, status, action_url = "", 200, ""
    if request.method == "POST" and startable:
        try:
            shown = runnow.shown_at(request.POST.get("token", ""), name, day, force)
        except runnow.StaleConfirmation as exc:
            error = str(exc)
        else:
            kind = JobAction.Kind.RUN_AGAIN if day else JobAction.Kind.RUN_NOW
            action, earlier = runnow.record_once(
                kind,
                name,
                request.user.get_username(),
                now,
                shown=shown,
                logical_date=day,
                force=force,
                note="manage.py " + " ".join(argv[:1] + argv[2:]),
            )
            if action is not None:
                runnow.spawn(argv, action.pk)  # committed: run_job finds its action
                return HttpResponseRedirect(reverse("admin:ops_job_action", args=[name, action.pk]))
            assert earlier is not None
            error = (
                f"already started by {earlier.username} at {pauses.local(earlier.at, tz)} "
                f"{tz}: see action #{earlier.pk}; nothing else was started"
            )
            action_url = reverse("admin:ops_job_action", args=[name, earlier.pk])
            startable, status = False, 409
    run_url = ""
    if state.run_id is not None:
        run_url = reverse("admin:ops_jobrun_change", args=[state.run_id])
    what = f"Run {name} again for {day or text[:40]}?" if text else f"Run {name} now?"
    offer_force = state.kind == runnow.DONE and not force and not action_url
    page = _page(
        admin,
        request,
        name,
        what,
        action="run",
        state=state.message,
        kind=state.kind,
        startable=startable,
        offer_force=offer_force,
        command="manage.py " + " ".join(argv[:1] + argv[2:]),
        date=day.isoformat() if day else "",
        force=force,
        run_url=run_url,
        error=error,
        action_url=action_url,
        # What the form's POST may start, and when this page was shown (signed).
        token=runnow.confirmation(name, day, force or offer_force, now),
    )
    page.status_code = status
    return page


def action_view(admin, request, name: str, pk: int):
    """What a Run now / Run again started: its run, once run_job has recorded it."""
    if not can_operate(request):
        raise PermissionDenied
    action = JobAction.objects.filter(pk=pk, job=name).select_related("run").first()
    if action is None:
        raise Http404("no such action")
    waited = (timezone.now() - action.at).total_seconds()
    context = {
        **admin.admin_site.each_context(request),
        "opts": admin.opts,
        "title": f"{action.get_kind_display().capitalize()}: {name}",
        "job": name,
        "action": action,
        "run": action.run,
        "run_url": reverse("admin:ops_jobrun_change", args=[action.run_id])
        if action.run_id
        else "",
        # Reload until the run is recorded and has ended (a minute at most without one).
        "reload": (action.run is None and waited < 60)
        or (action.run is not None and action.run.outcome == "running"),
        "log": str(conf.log_dir() / f"{name}.log"),
    }
    return TemplateResponse(request, "admin/ops/job/action.html", context)
