"""Rolling upgrades of a live cluster: the plan (``plan``) and its execution (``run``)."""
