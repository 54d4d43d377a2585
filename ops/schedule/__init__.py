"""The schedule: the crontab.d parser, the crontab installer, slots, options and exports."""
