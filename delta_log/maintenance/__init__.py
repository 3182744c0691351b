"""Keeping topics healthy: roll-up, log cleanup, retention, vacuum (one per-topic loop), and the
executors of the compaction and replication jobs."""
