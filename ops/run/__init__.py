"""One run of a job: the supervisor, its claim, lock, output, descendants and standby."""
