"""Stored times: one form, and strings that order like the instants, rows written in older forms included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from appliance.core import clock

MOMENT = datetime(2026, 11, 20, 13, 14, 8, 78_900, tzinfo=UTC)


def test_a_stored_time_is_utc_to_the_millisecond() -> None:
    assert clock.stamp(MOMENT) == "2026-11-20T13:14:08.078+00:00"
    assert clock.stamp(MOMENT.astimezone(timezone(timedelta(hours=2)))) == "2026-11-20T13:14:08.078+00:00"
    assert datetime.fromisoformat(clock.stamp()).utcoffset() == timedelta(0)


def test_stamps_of_any_precision_order_as_their_instants() -> None:
    instants = [MOMENT + timedelta(microseconds=step) for step in (-1_000_001, -1, 0, 1_000, 999_999, 1_000_000)]
    written = [(moment, moment.isoformat(timespec=precision)) for moment in instants
               for precision in ("seconds", "milliseconds", "microseconds")]
    written += [(moment, clock.stamp(moment)) for moment in instants]
    for first, first_text in written:
        for second, second_text in written:
            if first_text < second_text:  # the string order never puts a later instant first
                assert datetime.fromisoformat(first_text) <= datetime.fromisoformat(second_text)
            if first < second - timedelta(seconds=1):  # and instants a second apart never tie or swap
                assert first_text < second_text


def test_age_reads_a_stored_time_of_any_precision() -> None:
    for precision in ("seconds", "milliseconds", "microseconds"):
        age = clock.age((clock.now() - timedelta(minutes=5)).isoformat(timespec=precision))
        assert timedelta(minutes=5) <= age < timedelta(minutes=5, seconds=5)
