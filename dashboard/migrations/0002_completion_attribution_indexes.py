"""Two partial indexes on the completion log for the timeout table (dashboard/attribution.py).

They live here, not in admission, because only the dashboard reads through them; the log's
model does not list them, so Django leaves them alone. Measured with
benchmarks/dashboard_queries.py: "timeouts + holders" on a million rows went from 0.6-1.0 s to
the figures in docs/dashboard.md.

* completion_timeouts: the newest timeouts of a window without reading the calls around them.
* completion_holders: who held a worker's slots over an interval, answered from the index
  alone (admission time and run length are in it); only the matches are read from the table.
"""

from __future__ import annotations

from django.db import migrations

TABLE = "admission_completionlog"


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0001_queue_depth_worker_events_rollup"),
        ("admission", "0007_policy_override_and_labels"),
    ]

    operations = [
        migrations.RunSQL(
            f"CREATE INDEX IF NOT EXISTS completion_timeouts ON {TABLE} (created_at) "
            "WHERE admission_outcome = 'queue_timeout'",
            "DROP INDEX IF EXISTS completion_timeouts",
        ),
        migrations.RunSQL(
            f"CREATE INDEX IF NOT EXISTS completion_holders ON {TABLE} (worker_id, created_at) "
            "INCLUDE (id, queue_wait_ms, exec_ms) WHERE slot_index IS NOT NULL",
            "DROP INDEX IF EXISTS completion_holders",
        ),
    ]
