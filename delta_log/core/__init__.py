"""The pure core: records, topic config, segments, assignors, group rules, lag, ACLs and the plans
of roll-up, retention, compaction, replication and log cleanup. No deltalake, no clock, no files."""
