"""The run history, the slot claims, the effects done once and the jobs page in the Django
admin: read-only, fast on a large history.

Nothing here can add, change or delete a row: the history is evidence, and a claim (or an
effect marked by `ops.once`) is what stops a slot (or an effect) from happening twice. Filters
avoid `SELECT DISTINCT` over the whole table (the job filter lists names by a loose index
scan), and the change list never counts the full history.
"""

import datetime as dt
from collections.abc import Callable
from copy import deepcopy
from functools import partial, update_wrapper
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.options import FORMFIELD_FOR_DBFIELD_DEFAULTS
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.urls.resolvers import RoutePattern, URLPattern
from django.utils import timezone
from django.utils.html import format_html
from django.views.generic import RedirectView

from .models import Effect, Job, JobAction, JobRun, Outcome, SlotClaim

# The jobs page's modules (status, crontab.d, cronsim) are imported by its views, not here:
# Django imports every app's admin.py at start-up, for every management command.


def human_duration(seconds: float | None) -> str:
    from .schedule.durations import human_duration as said  # a page's, not every command's

    return said(seconds)


def _button(function: str, model_admin, request, *args, **kwargs):
    """A button's view (pause, resume, run now, run again), imported when it is asked for:
    every command's URL checks build the admin's URLs, and the views import the run's modules."""
    from .control import views

    return getattr(views, function)(model_admin, request, *args, **kwargs)


def nul_in(request) -> str:
    """What in `request` holds a NUL byte ("the address", "the field 'reason'"), or "".

    No job name, filter value or text of these pages can hold one: PostgreSQL refuses it in any
    string (a DataError: a 500), SQLite would store it."""
    if "\x00" in request.path:
        return "the address"
    for query in (request.GET, request.POST):
        for key, values in query.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return f"the field {key.replace(chr(0), '%00')!r}"
    return ""


def guarded(model_admin, view):
    """`view` of an ops admin as its URL calls it: answering 400, with one line saying where,
    when its request holds a NUL byte (in one place for every view: the jobs page, its buttons,
    the history's filters), else through the site's admin_view (login, CSRF, no cache) as
    Django's ModelAdmin.get_urls wraps its own: at the request, not when every command's URL
    checks build the URLs."""

    def view_or_400(request, *args, **kwargs):
        where = nul_in(request)
        if where:
            return HttpResponseBadRequest(
                f"Bad request: {where} holds a NUL byte (%00), which no job name or text "
                "can contain.\n",
                content_type="text/plain; charset=utf-8",
            )
        return model_admin.admin_site.admin_view(view)(request, *args, **kwargs)

    view_or_400.model_admin = model_admin  # type: ignore[attr-defined]
    return update_wrapper(view_or_400, view)


def _redirect_to(pattern_name: str):
    def redirect(request, *args, **kwargs):
        return RedirectView.as_view(pattern_name=pattern_name)(request, *args, **kwargs)

    return redirect


class JobFilter(admin.SimpleListFilter):
    title = "job"
    parameter_name = "job"

    def lookups(self, request, model_admin):
        from .monitors.status import history_job_names

        return [(name, name) for name in history_job_names(model_admin.model)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(job=self.value())
        return queryset


class OwnURL(URLPattern):
    """A URL of one of cronops' own ModelAdmins (Django's path() builds the same): Django's
    checks of it (of its route, name and view: cronops' code) run where those of its
    ModelAdmins do."""

    def check(self):
        from .checkgate import static_checks

        return super().check() if static_checks() else []


class ReadOnlyAdmin(admin.ModelAdmin):
    def __init__(self, model, admin_site):
        if type(self).__module__ != __name__:  # a project's subclass: Django's, whole
            super().__init__(model, admin_site)
            return
        # ModelAdmin's, without BaseModelAdmin's deep copy of Django's form-field defaults
        # (~0.5 M instructions a ModelAdmin, at the start of every command): made at first use
        self.model, self.opts, self.admin_site = model, model._meta, admin_site

    @property
    def formfield_overrides(self):
        if "_formfield_overrides" not in self.__dict__:
            self.__dict__["_formfield_overrides"] = deepcopy(FORMFIELD_FOR_DBFIELD_DEFAULTS)
        return self.__dict__["_formfield_overrides"]

    @formfield_overrides.setter
    def formfield_overrides(self, value):
        self.__dict__["_formfield_overrides"] = value

    actions = None
    # A large table: short pages, no full count, no facet counts (each would scan it all).
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        """Django's ModelAdmin.get_urls, routes and names alike (tests/test_admin.py compares
        them), each view wrapped once, by guarded(); built as path() builds them."""
        # a project's subclass may add URLs of its own: checked as any of the project's
        url = OwnURL if type(self).__module__ == __name__ else URLPattern
        return [
            url(RoutePattern(route, name, is_endpoint=True), guarded(self, view), None, name)
            for route, view, name in self.views()
        ]

    def views(self) -> list[tuple[str, Callable, str | None]]:
        """(route, view, URL name) of each page of this admin."""
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            ("", self.changelist_view, f"{info}_changelist"),
            ("add/", self.add_view, f"{info}_add"),
            ("<path:object_id>/history/", self.history_view, f"{info}_history"),
            ("<path:object_id>/delete/", self.delete_view, f"{info}_delete"),
            ("<path:object_id>/change/", self.change_view, f"{info}_change"),
            # Django's too: the change page's address before Django 1.9
            ("<path:object_id>/", _redirect_to(f"{self.admin_site.name}:{info}_change"), None),
        ]

    def check(self, **kwargs):
        from .checkgate import static_checks  # checks of this file's code: see there

        if type(self).__module__ != __name__ or static_checks():
            return super().check(**kwargs)
        return []


def iso(field: str, description: str):
    """A column or read-only field showing a date or time as ISO, in TIME_ZONE
    ("2026-12-02", "2026-12-02 03:00:01"), as job_status and the jobs page write them, rather
    than the admin's "Dec. 2, 2026"."""

    @admin.display(description=description, ordering=field)
    def show(self, obj):
        value = getattr(obj, field)
        if value is None:
            return "-"
        if hasattr(value, "tzinfo"):
            return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")
        return value.isoformat()

    return show


def outcome_words(value: str) -> str:
    """An outcome as the admin shows it: capitalised like Django's own labels ("Succeeded",
    "Timed out", "Taken over"), where the choices' labels mix "Succeeded" and "timed out"."""
    return dict(Outcome.choices).get(value, value).capitalize()


class OutcomeFilter(admin.SimpleListFilter):
    title = "outcome"
    parameter_name = "outcome__exact"  # the field filter's, so that links made for it work

    def lookups(self, request, model_admin):
        return [(value, outcome_words(value)) for value in Outcome.values]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(outcome=self.value())
        return queryset


def local_slot(key: str, at) -> str:
    """A slot as the admin shows times: in TIME_ZONE, without its key's UTC offset
    ("2026-12-03 03:00"); a date slot as its date. A time inside a repeated autumn hour keeps
    its offset: the two 02:30s of that night are two slots. The key itself is the title."""
    from .schedule.slots import is_date_key, utc_offset  # not at start-up: see above

    if not key or is_date_key(key):
        return key
    try:
        instant = dt.datetime.fromisoformat(key)
    except ValueError:
        instant = None
    if instant is None or instant.tzinfo is None:
        if at is None:
            return key
        instant = at
    local = timezone.localtime(instant)
    shown = local.strftime("%Y-%m-%d %H:%M")
    if local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset():
        shown += utc_offset(local)
    return shown


def two_lines(first, second="", second_class="cronops-quiet"):
    """A cell of the history: a value, and under it a second one in the admin's quiet grey."""
    if not second:
        return first
    return format_html('{}<span class="{}">{}</span>', first, second_class, second)


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdmin):
    # Five columns that fit beside the filters at 1,024 px (tests/test_admin_fit_browser.py):
    # related values share a cell (the start and its lag, the job and its slot, the outcome
    # and its exit code, the host and who started the run), the logical date is the slot's
    # date (the run's page has both), and the page does without the admin's app list, like
    # the jobs page.
    list_display = ["started", "job_slot", "outcome_label", "duration_display", "host_started_by"]
    list_display_links = ["started", "job_slot"]
    list_filter = [JobFilter, OutcomeFilter, ("started_at", admin.DateFieldListFilter)]
    search_fields = ["job", "slot", "note", "host", "command"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "job",
                    "outcome_label",
                    "exit_code",
                    "note",
                    "slot",
                    "logical_date_iso",
                    "scheduled_iso",
                    "started_iso",
                    "finished_iso",
                    "duration_display",
                    "lag_display",
                    "host",
                    "pid",
                    "rid",
                    "command",
                    "started_by",
                    "started_how",
                ]
            },
        ),
        ("Output (tail)", {"fields": ["output"]}),
    ]
    logical_date_iso = iso("logical_date", "logical date")
    scheduled_iso = iso("scheduled_at", "slot's fire time")
    started_iso = iso("started_at", "started at")
    finished_iso = iso("finished_at", "finished at")

    def get_queryset(self, request):
        # The list never shows the output tail: do not read it for 50 rows at a time.
        queryset = super().get_queryset(request)
        if request.resolver_match and request.resolver_match.url_name.endswith("changelist"):
            queryset = queryset.defer("output_tail")
        return queryset

    def get_ordering(self, request):
        # Newest first. Filtered by job, (job, -started_at) is an index; over the whole
        # history the primary key is (runs are inserted when they start).
        if request.GET.get(JobFilter.parameter_name):
            return ["-started_at", "-id"]
        return ["-id"]

    def changelist_view(self, request, extra_context=None):
        # The table needs the width: the admin's app list is one click away (breadcrumbs).
        return super().changelist_view(
            request, {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        )

    @admin.display(description="started, lag", ordering="started_at")
    def started(self, obj):
        started = timezone.localtime(obj.started_at).strftime("%Y-%m-%d %H:%M:%S")
        lag = human_duration(obj.lag)
        return two_lines(started, f"lag {lag}" if lag else "")

    @admin.display(description="job, slot", ordering="job")
    def job_slot(self, obj):
        if not obj.slot:
            return two_lines(obj.job)
        return format_html(
            '{}<span class="cronops-slot" title="slot {}">{}</span>',
            obj.job,
            obj.slot,
            local_slot(obj.slot, obj.scheduled_at),
        )

    @admin.display(description="outcome", ordering="outcome")
    def outcome_label(self, obj):
        from . import jobs_page

        colour = {
            Outcome.SUCCEEDED: "#1a7f37",
            Outcome.RUNNING: "#0969da",
            Outcome.SKIPPED: "#6e7781",
            Outcome.TAKEN_OVER: jobs_page.OUTCOME_COLOURS[Outcome.TAKEN_OVER],
        }.get(obj.outcome, "#cf222e")
        label = format_html(
            '<span class="cronops-outcome" style="color:{}">{}</span>',
            colour,
            outcome_words(obj.outcome),
        )
        if obj.exit_code:  # a success (and "already done") exits 0: said by the outcome
            exit_code = format_html('<span class="cronops-exit">exit {}</span>', obj.exit_code)
            label = format_html("{} {}", label, exit_code)
        if obj.attempt > 1:
            return two_lines(label, f"attempt {obj.attempt}")
        return label

    @admin.display(description="duration", ordering="duration")
    def duration_display(self, obj):
        return human_duration(obj.duration) or "-"

    @admin.display(description="start lag", ordering="lag")
    def lag_display(self, obj):
        return human_duration(obj.lag) or "-"

    @admin.display(description="host, started by", ordering="host")
    def host_started_by(self, obj):
        return two_lines(obj.host or "-", obj.started_how, "cronops-started-by cronops-quiet")

    @admin.display(description="output tail")
    def output(self, obj):
        if not obj.output_tail:
            return "(no output)"
        return format_html(
            '<pre class="cronops-output" style="white-space:pre-wrap;max-height:40em;'
            'overflow:auto;margin:0">{}</pre>',
            obj.output_tail,
        )


@admin.register(SlotClaim)
class SlotClaimAdmin(ReadOnlyAdmin):
    list_display = [
        "job",
        "slot",
        "logical_date_iso",
        "state",
        "version",
        "host",
        "pid",
        "started_iso",
        "heartbeat_iso",
        "run_link",
    ]
    logical_date_iso = iso("logical_date", "logical date")
    started_iso = iso("started_at", "started at")
    heartbeat_iso = iso("heartbeat_at", "heartbeat at")
    list_filter = [JobFilter, "state"]
    search_fields = ["job", "slot", "host"]
    ordering = ["-id"]

    @admin.display(description="run")
    def run_link(self, obj):
        return run_link(obj.run_id)


def run_link(run_id: int | None) -> str:
    if run_id is None:
        return "-"
    url = reverse("admin:ops_jobrun_change", args=[run_id])
    return format_html('<a href="{}">#{}</a>', url, run_id)


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin):
    """`ops.once(key)`'s marks: read-only like the claims (deleting one would let the effect
    happen again; prune_runs removes them with the history)."""

    list_display = ["job", "slot", "key", "created_iso", "version", "run"]
    created_iso = iso("created_at", "created at")
    list_filter = [JobFilter]
    search_fields = ["job", "slot", "key"]
    ordering = ["-id"]

    @admin.display(description="run")
    def run(self, obj):
        return run_link(obj.run_id)


@admin.register(JobAction)
class JobActionAdmin(ReadOnlyAdmin):
    """The audit trail: every pause, resume, run now and run again, by whom and when."""

    list_display = [
        "at_iso", "job", "kind", "username", "logical_date_iso", "force", "note", "run_link",
    ]  # fmt: skip
    at_iso = iso("at", "at")
    logical_date_iso = iso("logical_date", "logical date")
    list_filter = ["kind", ("at", admin.DateFieldListFilter)]
    search_fields = ["job", "username", "note"]

    @admin.display(description="run")
    def run_link(self, obj):
        return run_link(obj.run_id)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Ops → Jobs: one row per job with its state and pictures, and a calendar per job.

    Not a change list of a table: the two views below replace the model admin's URLs. Seen by
    whoever may view the run history (`ops.view_jobrun`), like the history itself.
    """

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("ops.view_jobrun")

    def views(self) -> list[tuple[str, Callable, str | None]]:
        def button(function: str) -> Callable:
            return partial(_button, function, self)

        return [
            ("", self.jobs_view, "ops_job_changelist"),
            ("<str:name>/", self.job_view, "ops_job_detail"),
            ("<str:name>/pause/", button("pause_view"), "ops_job_pause"),
            ("<str:name>/resume/", button("resume_view"), "ops_job_resume"),
            ("<str:name>/run/", button("run_view"), "ops_job_run"),
            ("<str:name>/actions/<int:pk>/", button("action_view"), "ops_job_action"),
        ]

    def _context(self, request, title: str, **extra) -> dict:
        from . import jobs_page

        if not self.has_view_permission(request):
            raise PermissionDenied
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "outcome_colours": [  # skips are not attempts: the strip never shows one
                (o.replace("_", " "), c)
                for o, c in jobs_page.OUTCOME_COLOURS.items()
                if o != Outcome.SKIPPED
            ],
            "strip": jobs_page.STRIP,
            "spark": jobs_page.SPARK,
            "can_operate": request.user.has_perm("ops.run_job"),  # the buttons (control/views.py)
            # The table needs the width: the admin's app list is one click away (breadcrumbs).
            "is_nav_sidebar_enabled": False,
            **extra,
        }

    def _report(self, only: str | None = None):
        """(schedule, report, error): crontab.d and status.collect, as job_status does it.

        A broken crontab.d is shown as one line above the jobs of the history."""
        from .monitors import status
        from .schedule.crontabd import CrontabError, Schedule, load_schedule

        error = ""
        try:
            schedule = load_schedule()
        except CrontabError as exc:
            schedule, error = Schedule(), str(exc)
        tz = ZoneInfo(settings.TIME_ZONE)
        report = status.collect(schedule, now=timezone.now(), tz=tz, only=only)
        return schedule, report, error

    def jobs_view(self, request):
        from . import jobs_page

        context = self._context(request, "Jobs")
        _, report, error = self._report()
        rows = jobs_page.job_rows(report)
        context.update(
            rows=jobs_page.problems_first(rows),
            summary=jobs_page.summary(rows),
            report=report,
            error=error,
            time_zone=settings.TIME_ZONE,
            now=jobs_page.local_time(report.now, report.tz),
        )
        return TemplateResponse(request, "admin/ops/job/jobs.html", context)

    def job_view(self, request, name: str):
        from . import jobs_page
        from .monitors import status

        context = self._context(request, f"Job {name}")
        try:
            schedule, report, error = self._report(only=name)
        except status.UnknownJob:
            raise Http404(f"no job named {name!r}") from None
        (job_status,) = report.jobs
        days = jobs_page.calendar(
            job_status,
            schedule.get(name),
            now=report.now,
            tz=report.tz,
            days=jobs_page.CALENDAR_DAYS,
        )
        runs = reverse("admin:ops_jobrun_changelist")
        scheduled = bool(job_status.schedule)
        for day in days:
            query = {"job": name}
            if scheduled:
                query["logical_date"] = day.date.isoformat()
            else:
                query["started_at__date"] = day.date.isoformat()
            day.url = f"{runs}?{urlencode(query)}"
        context.update(
            row=jobs_page.job_rows(report)[0],
            weeks=jobs_page.weeks(days),
            day_colours=list(jobs_page.DAY_COLOURS.items()),
            days=len(days),
            error=error,
            time_zone=settings.TIME_ZONE,
            now=jobs_page.local_time(report.now, report.tz),
            runs_url=f"{runs}?{urlencode({'job': name})}",
            # Run again, for the days without success (ops/control/views.py)
            rerun_days=[d for d in days if d.state in jobs_page.RUN_AGAIN] if scheduled else [],
        )
        return TemplateResponse(request, "admin/ops/job/job.html", context)
