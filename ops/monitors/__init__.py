"""The monitors: healthchecks.io pings and API sync, job status, metrics, redaction."""
