"""``pipeline.maintenance_window``: when the pipeline's Apply may recreate the long-lived
RayCluster (KubeRay's Recreate upgrade deletes every pod of it).

Syntax: ``"<days> HH:MM-HH:MM"`` in UTC, days ``daily`` or a comma list of ``mon`` ... ``sun``
(``"sat,sun 02:00-06:00"``). A window whose end is not after its start runs past midnight into
the next day (``"fri 22:00-04:00"`` is Friday 22:00 to Saturday 04:00). Empty: no window, Apply
may run at any time (it still waits for the jobs running on the cluster first).
"""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
SYNTAX = re.compile(r"(?a)(daily|[a-z]{3}(?:,[a-z]{3})*) ([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)")
ALLOWED = ('"<days> HH:MM-HH:MM" (UTC; days "daily" or a comma list of mon,tue,wed,thu,fri,sat,sun), '
           'e.g. "sat,sun 02:00-06:00", or "" for none')


@dataclass(frozen=True, slots=True)
class Window:
    """A weekly window: the weekdays it opens on (0 = Monday), its opening minute of the day and
    its length in minutes."""

    days: tuple[int, ...]
    start_minute: int
    minutes: int

    def _openings(self, now: datetime.datetime):
        """The openings around ``now`` (from 8 days before to 8 days after), in order."""
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        for offset in range(-8, 9):
            day = midnight + datetime.timedelta(days=offset)
            if day.weekday() in self.days:
                yield day + datetime.timedelta(minutes=self.start_minute)

    def is_open(self, now: datetime.datetime) -> bool:
        return any(o <= now < o + datetime.timedelta(minutes=self.minutes) for o in self._openings(now))

    def closes(self, now: datetime.datetime) -> datetime.datetime | None:
        """When the window that is open at ``now`` closes (None when it is not open)."""
        return next((o + datetime.timedelta(minutes=self.minutes) for o in self._openings(now)
                     if o <= now < o + datetime.timedelta(minutes=self.minutes)), None)

    def next_opening(self, now: datetime.datetime) -> datetime.datetime:
        return next(o for o in self._openings(now) if o > now)


def window_problem(text: str) -> str:
    """Why ``text`` is not a maintenance window ("" when it is, or empty)."""
    if not text:
        return ""
    match = SYNTAX.fullmatch(text)
    if not match:
        return f"is not {ALLOWED}"
    days = match.group(1)
    unknown = [d for d in days.split(",") if d not in DAYS] if days != "daily" else []
    if unknown:
        return f"has unknown day(s) {', '.join(unknown)}: allowed {ALLOWED}"
    if match.group(2, 3) == match.group(4, 5):
        return "opens and closes at the same minute: give a window of at least one minute"
    return ""


def parse_window(text: str) -> Window | None:
    """The window (None for ""). ValueError naming the problem for a bad one (the spec checks
    it first with :func:`window_problem`)."""
    if not text:
        return None
    if problem := window_problem(text):
        raise ValueError(f"maintenance window {text!r} {problem}")
    match = SYNTAX.fullmatch(text)
    days = tuple(range(7)) if match.group(1) == "daily" else tuple(sorted(DAYS.index(d) for d in match.group(1).split(",")))
    start = int(match.group(2)) * 60 + int(match.group(3))
    end = int(match.group(4)) * 60 + int(match.group(5))
    return Window(days=days, start_minute=start, minutes=(end - start) % (24 * 60))
