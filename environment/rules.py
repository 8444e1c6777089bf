"""Rules that several fields (and several tools) apply: S3 bucket names, EventBridge schedule
expressions, the pipeline's maintenance window, the Ray version an image tag names. One function
per rule, so an explicit value and a derived one are judged alike. Each ``*_problem`` returns the
problem as text ("" = fine); callers name the field. Some rules also give what they judged: the
derived bucket name, which passes the same validator as a typed one (:func:`bucket_name_problem`),
so a derived name is never one the spec would refuse if typed in; the Ray version a tag names
(:func:`ray_version_in_tag`); and the maintenance window parsed (:func:`parse_window`,
:class:`MaintenanceWindow`: open now, when it closes, its next opening), which the image watcher
and the pipeline's Apply and HoldDeploy steps read from the same text the spec checked.
"""
from __future__ import annotations

import datetime
import hashlib
import re
from dataclasses import dataclass

DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
"""A Kubernetes / DNS label: names of the cluster, node groups, namespace, service account."""
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes object name such as a PersistentVolumeClaim's (apimachinery's IsDNS1123Subdomain)."""

_BUCKET_CHARS = re.compile(r"[a-z0-9.-]+")
_IPV4 = re.compile(r"(?a)\d{1,3}(\.\d{1,3}){3}")
# S3 general purpose bucket naming rules (AWS S3 User Guide, "General purpose bucket naming rules").
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_name_problem(name: str) -> str:
    """What breaks S3's bucket naming rules in ``name`` ("" if nothing).

    A dash next to a period is refused too: S3 accepted it once, but such a name fails the
    virtual-hosted TLS certificate and is refused by newer tooling."""
    if not 3 <= len(name) <= 63:
        return f"is {len(name)} characters (an S3 bucket name has 3-63)"
    if not _BUCKET_CHARS.fullmatch(name):
        return "is not a valid S3 bucket name (3-63 of a-z 0-9 . -)"
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "is not a valid S3 bucket name (must start and end with a letter or digit)"
    for pair, what in (("..", "two adjacent periods"), (".-", "a period next to a dash"),
                       ("-.", "a dash next to a period")):
        if pair in name:
            return f"is not a valid S3 bucket name ({what})"
    if _IPV4.fullmatch(name):
        return "is not a valid S3 bucket name (formatted as an IP address)"
    for prefix in _BUCKET_RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"is not a valid S3 bucket name (the prefix {prefix!r} is reserved by AWS)"
    for suffix in _BUCKET_RESERVED_SUFFIXES:
        if name.endswith(suffix):
            return f"is not a valid S3 bucket name (the suffix {suffix!r} is reserved by AWS)"
    return ""


def derived_bucket_name(cluster: str, account: str, region: str) -> str:
    """``raytrain-<cluster>-<account>-<region>``; over 63 characters, the cluster part is cut and
    8 hex of a hash of the full name keep it unique (a plain cut could end in '-')."""
    full = "-".join(p for p in ("raytrain", cluster, account, region) if p)
    if len(full) <= 63:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    tail = "-".join(p for p in (account, region) if p)
    room = 63 - len("raytrain--") - len(digest) - 1 - len(tail)
    return f"raytrain-{cluster[:room].rstrip('-')}-{digest}-{tail}"


_RATE = re.compile(r"(?a)rate\((\d+) ([a-z]+)\)")
_RATE_UNITS = ("minute", "hour", "day")
# EventBridge cron: minutes hours day-of-month month day-of-week year (Amazon EventBridge
# User Guide, "Schedule expressions for rules"); (field name, characters, numeric range).
_CRON_FIELDS = (
    ("minutes", r"[0-9,*/-]+", (0, 59)),
    ("hours", r"[0-9,*/-]+", (0, 23)),
    ("day-of-month", r"[0-9,*/?LW-]+", (1, 31)),
    ("month", r"[0-9A-Za-z,*/-]+", (1, 12)),
    ("day-of-week", r"[0-9A-Za-z,*?L#-]+", (1, 7)),
    ("year", r"[0-9,*/-]+", (1970, 2199)),
)
_SCHEDULE_HELP = "(EventBridge: rate(1 hour), rate(6 hours) or cron(0 */6 * * ? *) with 6 fields)"


def schedule_problem(expression: str) -> str:
    """What EventBridge would refuse in a schedule expression ("" if nothing)."""
    rate = _RATE.fullmatch(expression)
    if rate:
        value, unit = int(rate.group(1)), rate.group(2)
        if value < 1:
            return f"is not an EventBridge schedule: the rate must be >= 1 {_SCHEDULE_HELP}"
        want = _RATE_UNITS if value == 1 else tuple(u + "s" for u in _RATE_UNITS)
        if unit not in want:
            return (f"is not an EventBridge schedule: rate({value} ...) takes the unit "
                    f"{' / '.join(want)} {_SCHEDULE_HELP}")
        return ""
    if expression.startswith("cron(") and expression.endswith(")"):
        fields = expression[len("cron("):-1].split()
        if len(fields) != 6:
            return (f"is not an EventBridge schedule: cron(...) has {len(fields)} fields, EventBridge "
                    f"needs 6 (minutes hours day-of-month month day-of-week year) {_SCHEDULE_HELP}")
        for value, (name, chars, (low, high)) in zip(fields, _CRON_FIELDS):
            if not re.fullmatch(chars, value):
                return f"is not an EventBridge schedule: cron {name} field {value!r} {_SCHEDULE_HELP}"
            numbers = [int(n) for n in re.findall(r"(?a)(?<![/#])\b\d+", value)]
            if any(not low <= n <= high for n in numbers):
                return f"is not an EventBridge schedule: cron {name} field {value!r} is outside {low}-{high}"
        if (fields[2] == "?") == (fields[4] == "?"):
            return ("is not an EventBridge schedule: exactly one of day-of-month and day-of-week must be '?' "
                    + _SCHEDULE_HELP)
        return ""
    return f"is not an EventBridge schedule {_SCHEDULE_HELP}"


# --- pipeline.maintenance_window ---------------------------------------------------------------
# When the pipeline's Apply may recreate the long-lived RayCluster (KubeRay's Recreate upgrade
# deletes every pod of it); judged by the spec, the image watcher and the Apply and HoldDeploy
# steps alike.
# Syntax: ``"<days> HH:MM-HH:MM"`` in UTC, days ``daily`` or a comma list of ``mon`` ... ``sun``
# (``"sat,sun 02:00-06:00"``). A window whose end is not after its start runs past midnight into
# the next day (``"fri 22:00-04:00"`` is Friday 22:00 to Saturday 04:00). Empty: no window, Apply
# may run at any time (it still waits for the jobs running on the cluster first).

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW_SYNTAX = re.compile(r"(?a)(daily|[a-z]{3}(?:,[a-z]{3})*) ([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)")
_WINDOW_ALLOWED = ('"<days> HH:MM-HH:MM" (UTC; days "daily" or a comma list of mon,tue,wed,thu,fri,sat,sun), '
                   'e.g. "sat,sun 02:00-06:00", or "" for none')


@dataclass(frozen=True, slots=True)
class MaintenanceWindow:
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
    match = _WINDOW_SYNTAX.fullmatch(text)
    if not match:
        return f"is not {_WINDOW_ALLOWED}"
    days = match.group(1)
    unknown = [d for d in days.split(",") if d not in WEEKDAYS] if days != "daily" else []
    if unknown:
        return f"has unknown day(s) {', '.join(unknown)}: allowed {_WINDOW_ALLOWED}"
    if match.group(2, 3) == match.group(4, 5):
        return "opens and closes at the same minute: give a window of at least one minute"
    return ""


def parse_window(text: str) -> MaintenanceWindow | None:
    """The window (None for ""). ValueError naming the problem for a bad one (the spec checks
    it first with :func:`window_problem`)."""
    if not text:
        return None
    if problem := window_problem(text):
        raise ValueError(f"maintenance window {text!r} {problem}")
    match = _WINDOW_SYNTAX.fullmatch(text)
    days = tuple(range(7)) if match.group(1) == "daily" else tuple(sorted(WEEKDAYS.index(d) for d in match.group(1).split(",")))
    start = int(match.group(2)) * 60 + int(match.group(3))
    end = int(match.group(4)) * 60 + int(match.group(5))
    return MaintenanceWindow(days=days, start_minute=start, minutes=(end - start) % (24 * 60))


_TAG_RAY = re.compile(r"(?a)(?:^|ray[-_]?v?)(\d+\.\d+(?:\.\d+)?)(?=$|[-_])")


def ray_version_in_tag(tag: str) -> str:
    """The Ray version an image tag names (``2.40.0-py311-cu121``, ``ray-2.40``), or "".

    A tag like the DLC's ``train-ml-cuda-v1.1.0`` names the image's own release, not Ray's."""
    found = _TAG_RAY.search(tag)
    return found.group(1) if found else ""


def tag_ray_problem(tag: str, ray_version: str) -> str:
    """A tag that names a Ray other than ``ray_version`` ("" when it names none or the same)."""
    named = ray_version_in_tag(tag)
    if named and ray_version != named and not ray_version.startswith(named + "."):
        return f"names Ray {named} but image.ray_version is {ray_version} (the rayVersion of every RayCluster)"
    return ""
