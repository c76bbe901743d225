"""Date formats for the admin and dashboard: ISO-like, to the second, 24-hour.

Django's en formats ("Dec. 1, 2026, 9:44 p.m.") drop the seconds, and a completion log
read without seconds cannot tell a burst from a trickle.
"""

from __future__ import annotations

DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
