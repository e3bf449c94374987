"""The job state machine, its transitions, the retry policy and request hashing."""
