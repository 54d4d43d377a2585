"""Slots and logical dates in TIME_ZONE, with Debian cron's rules on DST days."""

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from ops.slots import current_slot, previous_slots, slot_on_date

BERLIN = ZoneInfo("Europe/Berlin")
MOSCOW = ZoneInfo("Europe/Moscow")
UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def test_a_run_serves_the_latest_fire_time_at_or_before_its_start():
    slot = current_slot("0 3 * * *", at("2026-11-29T03:00:00+01:00"), BERLIN)
    assert (slot.key, slot.logical_date) == ("2026-11-29 03:00", dt.date(2026, 11, 29))
    before = current_slot("0 3 * * *", at("2026-11-29T02:59:59+01:00"), BERLIN)
    assert before.key == "2026-11-28 03:00"


def test_a_fixed_time_in_the_skipped_spring_hour_still_runs_that_day():
    # 2026-03-29 02:00 → 03:00 in Berlin: cron runs a 02:30 job right after the jump.
    slot = current_slot("30 2 * * *", at("2026-03-29T03:00:20+02:00"), BERLIN)
    assert slot.logical_date == dt.date(2026, 3, 29)
    assert slot_on_date("30 2 * * *", dt.date(2026, 3, 29), BERLIN).key == slot.key


def test_the_repeated_autumn_hour_maps_onto_the_slots_it_already_had():
    # 2026-10-25 03:00 CEST → 02:00 CET: 02:30 happens twice on the wall clock.
    first = current_slot("*/30 * * * *", at("2026-10-25T02:30:05+02:00"), BERLIN)
    second = current_slot("*/30 * * * *", at("2026-10-25T02:30:05+01:00"), BERLIN)
    assert first.key == second.key == "2026-10-25 02:30"
    daily_first = current_slot("30 2 * * *", at("2026-10-25T02:30:05+02:00"), BERLIN)
    daily_second = current_slot("30 2 * * *", at("2026-10-25T02:30:05+01:00"), BERLIN)
    assert daily_first.key == daily_second.key == "2026-10-25 02:30"


def test_catch_up_slots_skip_the_repeated_hour_duplicates():
    slot = current_slot("*/30 * * * *", at("2026-10-25T03:00:05+01:00"), BERLIN)
    keys = [s.key for s in previous_slots("*/30 * * * *", slot, 4, BERLIN)]
    # 02:30 and 02:00 come twice going back; each is one slot.
    assert keys == ["2026-10-25 01:00", "2026-10-25 01:30", "2026-10-25 02:00", "2026-10-25 02:30"]


@pytest.mark.parametrize(
    ("instant", "expected"),
    [
        # Moscow has no DST: 00:30 in Moscow is 21:30 UTC the day before.
        ("2026-03-28T21:30:10+00:00", "2026-03-29 00:30"),
        ("2026-10-24T21:30:10+00:00", "2026-10-25 00:30"),
    ],
)
def test_a_zone_without_dst_gets_the_business_date_not_the_utc_date(instant, expected):
    slot = current_slot("30 0 * * *", at(instant), MOSCOW)
    assert slot.key == expected
    assert slot.logical_date.isoformat() == expected[:10]


def test_previous_slots_are_oldest_first_with_their_own_dates():
    slot = current_slot("0 3 * * *", at("2026-11-29T04:00:00+03:00"), MOSCOW)
    earlier = previous_slots("0 3 * * *", slot, 3, MOSCOW)
    assert [s.logical_date.day for s in earlier] == [26, 27, 28]


def test_a_date_without_a_slot_is_refused():
    with pytest.raises(ValueError, match="no slot on 2026-11-29"):
        slot_on_date("0 3 * * 1", dt.date(2026, 11, 29), MOSCOW)  # a Sunday
