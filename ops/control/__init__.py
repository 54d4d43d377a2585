"""What operators do to jobs besides scheduling them: pause and resume them (`job_pause`,
`job_resume`, the jobs page), run one now from the jobs page, and the audit trail of all of it
(ops.models.JobPause, JobAction)."""
