"""``pipeline.maintenance_window`` (environment/rules.py ``parse_window``): when Apply may recreate
the long-lived cluster (fixed times, no clock)."""
from __future__ import annotations

import datetime

import pytest

from environment.rules import parse_window, window_problem

UTC = datetime.timezone.utc
FRI_2200 = datetime.datetime(2026, 12, 4, 22, 0, tzinfo=UTC)  # 2026-12-04 is a Friday


@pytest.mark.parametrize("text, at, is_open", [
    ("sat,sun 02:00-06:00", datetime.datetime(2026, 12, 5, 2, 0, tzinfo=UTC), True),   # Sat, opening minute
    ("sat,sun 02:00-06:00", datetime.datetime(2026, 12, 5, 6, 0, tzinfo=UTC), False),  # closing minute: closed
    ("sat,sun 02:00-06:00", datetime.datetime(2026, 12, 7, 3, 0, tzinfo=UTC), False),  # Monday
    ("fri 22:00-04:00", datetime.datetime(2026, 12, 5, 3, 59, tzinfo=UTC), True),      # past midnight, into Sat
    ("fri 22:00-04:00", datetime.datetime(2026, 12, 4, 4, 0, tzinfo=UTC), False),      # Fri 04:00: Thursday's did not open
    ("daily 00:00-00:30", datetime.datetime(2026, 12, 9, 0, 29, tzinfo=UTC), True),
])
def test_window_open_or_closed(text, at, is_open):
    assert parse_window(text).is_open(at) is is_open


def test_when_it_closes_and_next_opens():
    window = parse_window("fri 22:00-04:00")
    assert window.closes(FRI_2200) == datetime.datetime(2026, 12, 5, 4, 0, tzinfo=UTC)
    assert window.closes(FRI_2200 - datetime.timedelta(minutes=1)) is None
    assert window.next_opening(FRI_2200) == datetime.datetime(2026, 12, 11, 22, 0, tzinfo=UTC)


def test_no_window_and_bad_windows():
    assert parse_window("") is None and window_problem("") == ""
    assert "is not" in window_problem("sat 2:00-6:00")
    with pytest.raises(ValueError, match="unknown day"):
        parse_window("sun,sat,xyz 02:00-03:00")
