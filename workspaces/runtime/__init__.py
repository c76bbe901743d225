"""The worker runtime: what `manage.py runworker` runs on a user's machine."""
