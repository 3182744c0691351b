"""The job scheduler's plan: which jobs, how often, and that a failing job does not stop the others."""

from conf import load_settings
from jobs.scheduler import Scheduled, run_due, schedule_of


def test_replication_is_scheduled_only_with_a_replica_root():
    names = [j.name for j in schedule_of(load_settings())]
    assert names == ["rebalance", "retention", "compaction", "upsert"]
    s = load_settings(jobs={"replica_root": "/tmp/replica", "replication_interval_s": 7})
    [rep] = [j for j in schedule_of(s) if j.name == "replication"]
    assert rep.interval_s == 7


def test_run_due_runs_what_is_due_and_survives_a_failure(capsys):
    calls = []

    def ok(spark, settings):
        calls.append("ok")
        return {"n": 1}

    def boom(spark, settings):
        calls.append("boom")
        raise RuntimeError("storage on fire")

    jobs = [
        Scheduled("boom", 10, boom, next_at=0),
        Scheduled("ok", 10, ok, next_at=0),
        Scheduled("later", 10, ok, next_at=50),
    ]
    assert run_due(jobs, None, load_settings(), now=5) == ["boom", "ok"]
    assert calls == ["boom", "ok"] and jobs[0].next_at == 15
    out = capsys.readouterr().out.splitlines()
    assert '"ok": false' in out[0] and "storage on fire" in out[0] and '"ok": true' in out[1]
    assert run_due(jobs, None, load_settings(), now=6) == []
