"""The Ray runtime of a job: the driver loop, the explorer pool, the learner group, a local Ray."""
