"""Slots, their keys and logical dates in TIME_ZONE, with Debian cron's rules on DST days."""

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from ops.schedule.slots import (
    current_slot,
    date_slot,
    once_a_day,
    previous_slots,
    slot_on_date,
    time_key,
)

BERLIN = ZoneInfo("Europe/Berlin")
MOSCOW = ZoneInfo("Europe/Moscow")
UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def test_a_run_serves_the_latest_fire_time_at_or_before_its_start():
    slot = current_slot("15 * * * *", at("2026-11-29T03:15:00+01:00"), BERLIN)
    assert (slot.key, slot.logical_date) == ("2026-11-29 03:15+01:00", dt.date(2026, 11, 29))
    assert slot.at == at("2026-11-29T03:15:00+01:00")
    before = current_slot("15 * * * *", at("2026-11-29T03:14:59+01:00"), BERLIN)
    assert before.key == "2026-11-29 02:15+01:00"


def test_a_once_a_day_schedule_is_keyed_by_its_logical_date():
    slot = current_slot("0 3 * * *", at("2026-11-29T03:00:00+01:00"), BERLIN)
    assert (slot.key, slot.logical_date) == ("2026-11-29", dt.date(2026, 11, 29))
    assert slot.at == at("2026-11-29T03:00:00+01:00")
    assert current_slot("0 3 * * *", at("2026-11-29T02:59:59+01:00"), BERLIN).key == "2026-11-28"
    # An edit to 04:00 keeps the day's key: the day served at 03:00 is already done.
    assert current_slot("0 4 * * *", at("2026-11-29T04:00:05+01:00"), BERLIN).key == slot.key
    # A by-hand --logical-date run meets the same claim as cron's run, and as an unscheduled one.
    assert slot_on_date("0 3 * * *", dt.date(2026, 11, 29), BERLIN).key == slot.key
    assert date_slot(dt.date(2026, 11, 29)).key == slot.key


@pytest.mark.parametrize(
    ("expr", "daily"),
    [
        ("0 3 * * *", True),
        ("30 4 * * 1", True),
        ("0 0 1 1 *", True),  # @yearly
        ("0 0 * * 0", True),  # @weekly
        ("5 03 */2 * *", True),
        ("0 * * * *", False),  # @hourly
        ("*/15 * * * *", False),
        ("* * * * *", False),
        ("0,30 3 * * *", False),
        ("0 3-5 * * *", False),
        ("0 */6 * * *", False),
    ],
)
def test_only_a_single_minute_and_hour_make_a_once_a_day_schedule(expr, daily):
    assert once_a_day(expr) is daily


def test_the_two_0230s_of_the_repeated_autumn_hour_are_two_slots_for_a_wildcard_job():
    # 2026-10-25 03:00 CEST → 02:00 CET: cron fires `*/30` at 02:30 CEST and again at 02:30 CET.
    first = current_slot("*/30 * * * *", at("2026-10-25T02:30:05+02:00"), BERLIN)
    second = current_slot("*/30 * * * *", at("2026-10-25T02:30:05+01:00"), BERLIN)
    assert first.key == "2026-10-25 02:30+02:00"
    assert second.key == "2026-10-25 02:30+01:00"
    assert second.at.astimezone(UTC) - first.at.astimezone(UTC) == dt.timedelta(hours=1)
    assert first.logical_date == second.logical_date == dt.date(2026, 10, 25)


def test_a_fixed_time_job_has_one_slot_in_the_repeated_hour():
    # cron never fires `30 2` twice; a run in the second 02:30 serves the first one.
    first = current_slot("30 2 * * *", at("2026-10-25T02:30:05+02:00"), BERLIN)
    second = current_slot("30 2 * * *", at("2026-10-25T02:30:05+01:00"), BERLIN)
    assert first == second
    assert first.key == "2026-10-25"
    fixed = current_slot("30 2,14 * * *", at("2026-10-25T02:45:00+01:00"), BERLIN)
    assert fixed.key == "2026-10-25 02:30+02:00"


def test_a_clock_stepped_back_meets_the_slots_it_already_had():
    # Not DST: the offset stays, so 02:15 after a step back from 03:10 is the 02:15 slot again.
    before = current_slot("*/15 * * * *", at("2026-06-10T02:15:05+02:00"), BERLIN)
    again = current_slot("*/15 * * * *", at("2026-06-10T02:15:40+02:00"), BERLIN)
    assert before.key == again.key == "2026-06-10 02:15+02:00"


def test_a_fixed_time_in_the_skipped_spring_hour_still_runs_that_day():
    # 2026-03-29 02:00 → 03:00 in Berlin: cron runs a 02:30 job right after the jump.
    slot = current_slot("30 2 * * *", at("2026-03-29T03:00:20+02:00"), BERLIN)
    assert slot.logical_date == dt.date(2026, 3, 29)
    assert slot.at == at("2026-03-29T03:00:00+02:00")
    assert slot_on_date("30 2 * * *", dt.date(2026, 3, 29), BERLIN).key == slot.key
    several = current_slot("30 2,14 * * *", at("2026-03-29T03:00:20+02:00"), BERLIN)
    assert several.key == "2026-03-29 03:00+02:00"


def test_the_reverse_walk_yields_every_second_occurrence_fire_of_a_wildcard_schedule():
    """Cron fires `* * * * *` 60 more times, `*/15` 4 and `0 *` once in the repeated hour."""
    start = at("2026-10-25T04:00:00+01:00")
    end = at("2026-10-25T00:00:00+02:00")
    for expr, per_night in [("* * * * *", 300), ("*/15 * * * *", 20), ("0 * * * *", 5)]:
        keys = [s.key for s in previous_slots(expr, current_slot(expr, start, BERLIN), 400, BERLIN)]
        keys = [k for k in keys if k >= "2026-10-25 00:00"]
        fires = CronSim(expr, (end - dt.timedelta(minutes=1)).astimezone(BERLIN))
        forward = [time_key(f) for f in itertools.takewhile(lambda f: f < start, fires)]
        assert len(keys) == len(set(keys)) == per_night  # 00:00-04:00 is five real hours
        assert sorted(keys) == sorted(forward)
    quarter = [
        s.key
        for s in previous_slots(
            "*/15 * * * *",
            current_slot("*/15 * * * *", at("2026-10-25T03:00:05+01:00"), BERLIN),
            8,
            BERLIN,
        )
    ]
    assert quarter == [
        "2026-10-25 02:00+02:00",
        "2026-10-25 02:15+02:00",
        "2026-10-25 02:30+02:00",
        "2026-10-25 02:45+02:00",
        "2026-10-25 02:00+01:00",
        "2026-10-25 02:15+01:00",
        "2026-10-25 02:30+01:00",
        "2026-10-25 02:45+01:00",
    ]


@pytest.mark.parametrize(
    ("instant", "expected"),
    [
        # Moscow has no DST: 00:30 in Moscow is 21:30 UTC the day before.
        ("2026-03-28T21:30:10+00:00", "2026-03-29 00:30+03:00"),
        ("2026-10-24T21:30:10+00:00", "2026-10-25 00:30+03:00"),
    ],
)
def test_a_zone_without_dst_gets_the_business_date_not_the_utc_date(instant, expected):
    slot = current_slot("30 0,12 * * *", at(instant), MOSCOW)
    assert slot.key == expected
    assert slot.logical_date.isoformat() == expected[:10]
    assert current_slot("30 0 * * *", at(instant), MOSCOW).key == expected[:10]


def test_previous_slots_are_oldest_first_with_their_own_dates():
    slot = current_slot("0 3 * * *", at("2026-11-29T04:00:00+03:00"), MOSCOW)
    earlier = previous_slots("0 3 * * *", slot, 3, MOSCOW)
    assert [s.key for s in earlier] == ["2026-11-26", "2026-11-27", "2026-11-28"]


def test_previous_slots_stop_at_the_latest_success_and_at_the_first_claim():
    slot = current_slot("0 3 * * *", at("2026-11-29T04:00:00+03:00"), MOSCOW)
    latest = at("2026-11-27T03:00:00+03:00")
    assert [s.key for s in previous_slots("0 3 * * *", slot, 10, MOSCOW, after=latest)] == [
        "2026-11-28"
    ]
    first = at("2026-11-26T03:00:00+03:00")
    keys = [s.key for s in previous_slots("0 3 * * *", slot, 10, MOSCOW, since=first)]
    assert keys == ["2026-11-26", "2026-11-27", "2026-11-28"]


def test_the_walk_back_stops_at_year_one_instead_of_raising():
    # @yearly from the year 50 with 100 slots asked for: 49 exist; before year 1 there is none.
    slot = current_slot("0 0 1 1 *", dt.datetime(50, 6, 1, tzinfo=UTC), UTC)
    earlier = previous_slots("0 0 1 1 *", slot, 100, UTC)
    assert len(earlier) == 49
    assert earlier[0].key == "0001-01-01"


def test_a_date_without_a_slot_is_refused():
    with pytest.raises(ValueError, match="no slot on 2026-11-29"):
        slot_on_date("0 3 * * 1", dt.date(2026, 11, 29), MOSCOW)  # a Sunday
    with pytest.raises(ValueError, match="no slot on 0001-01-01"):
        slot_on_date("0 3 * * *", dt.date(1, 1, 1), BERLIN)  # before the calendar's start


def test_a_run_in_the_second_pass_of_the_repeated_hour_serves_the_first_pass_fire_time():
    """Found by tests/test_property.py: from 02:10 CET (the repeated hour's second pass) the
    reverse walk compared wall clocks, skipped the 02:30 CEST fire of an hour earlier and
    answered the day before: a by-hand run claimed 2026-10-24 while the 25th was due."""
    slot = current_slot("30 2 * * *", at("2026-10-25T02:10:00+01:00"), BERLIN)
    assert (slot.key, slot.at.astimezone(UTC)) == ("2026-10-25", at("2026-10-25T02:30:00+02:00"))
    assert current_slot("0 2 * * *", at("2026-10-25T02:59:30+02:00"), BERLIN).key == "2026-10-25"
    several = current_slot("30 2,14 * * *", at("2026-10-25T02:10:00+01:00"), BERLIN)
    assert several.key == "2026-10-25 02:30+02:00"


@pytest.mark.parametrize(
    "expr", ["30 2 * * *", "0 2 * * *", "0 3 * * *", "30 * * * *", "*/20 * * * *", "15 */2 * * *"]
)
def test_the_current_slot_is_the_latest_fire_of_the_forward_walk_all_through_an_autumn_night(
    expr,
):
    start = at("2026-10-24T23:00:00+02:00")
    fires = list(
        itertools.takewhile(
            lambda f: f < at("2026-10-25T05:00:00+01:00"),
            CronSim(expr, (start - dt.timedelta(days=2)).astimezone(BERLIN)),
        )
    )
    now = start
    while now < at("2026-10-25T04:00:00+01:00"):
        for second in (0, 59):
            instant = now + dt.timedelta(seconds=second)
            # Compared in UTC: in one zone, datetimes compare by wall clock, fold ignored.
            latest = [f.astimezone(UTC) for f in fires if f.astimezone(UTC) <= instant][-1]
            served = current_slot(expr, instant, BERLIN).at.astimezone(UTC)
            assert served == latest, instant.astimezone(BERLIN)
        now += dt.timedelta(minutes=1)
