"""The TRL releases a user can pin, and the two dates each is resolved at: the end of the month of
its release (what its users installed then) and today (what a user installing that pin gets now)."""

from __future__ import annotations

import calendar
import datetime
import json
import urllib.request

from packaging.version import Version

FIRST, LAST = Version("0.14.0"), Version("1.16.0")
PYPI = "https://pypi.org/pypi/{name}/json"


def pypi_releases(name: str = "trl") -> dict[str, datetime.date]:
    """Final releases of ``name`` on PyPI with the day of their first upload."""
    with urllib.request.urlopen(PYPI.format(name=name), timeout=60) as response:
        data = json.load(response)
    found = {}
    for version, files in data["releases"].items():
        parsed = Version(version)
        uploads = [f["upload_time_iso_8601"][:10] for f in files if not f.get("yanked")]
        if parsed.is_prerelease or parsed.is_devrelease or not uploads:
            continue
        found[version] = datetime.date.fromisoformat(min(uploads))
    return found


def month_end(day: datetime.date) -> datetime.date:
    return day.replace(day=calendar.monthrange(day.year, day.month)[1])


def rows(today: datetime.date, first: Version = FIRST, last: Version = LAST, only: list[str] | None = None) -> list[dict]:
    """One row per (release, date) from ``first`` to ``last``: ``date_kind`` "month-end" or "today"."""
    out = []
    for version, released in sorted(pypi_releases().items(), key=lambda item: Version(item[0])):
        if not first <= Version(version) <= last or (only and version not in only):
            continue
        for kind, date in (("month-end", min(month_end(released), today)), ("today", today)):
            out.append({"trl": version, "released": released.isoformat(), "date_kind": kind, "date": date.isoformat()})
    return out
