from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.log_cleanup_plan import LogFile, plan_log_cleanup


def log_files(latest, checkpoints, age=100.0):
    files = [LogFile(f"{v:020d}.json", 0.0) for v in range(latest + 1)]
    files += [LogFile(f"{c:020d}.checkpoint.parquet", 0.0) for c in checkpoints]
    files.append(LogFile("_last_checkpoint", 0.0))
    return files


def test_keeps_recent_versions_and_their_checkpoint():
    doomed = set(plan_log_cleanup(log_files(350, [100, 200, 300]), keep_versions=120, min_age_s=0, now_s=1000))
    # cutoff 230 -> anchor checkpoint 200: commits < 200 and checkpoint 100 go
    assert doomed == {f"{v:020d}.json" for v in range(200)} | {f"{100:020d}.checkpoint.parquet"}


def test_nothing_without_a_checkpoint_below_the_cutoff():
    assert plan_log_cleanup(log_files(150, [100]), keep_versions=100, min_age_s=0, now_s=1000) == []
    assert plan_log_cleanup(log_files(50, []), keep_versions=10, min_age_s=0, now_s=1000) == []


def test_young_files_stay():
    assert plan_log_cleanup(log_files(350, [100, 200, 300]), keep_versions=10, min_age_s=60, now_s=30) == []


@given(st.integers(0, 3000), st.sets(st.integers(0, 3000), max_size=40), st.integers(10, 500))
def test_head_and_recent_history_stay_loadable(latest, checkpoints, keep):
    checkpoints = {c for c in checkpoints if c <= latest}
    files = log_files(latest, sorted(checkpoints))
    doomed = set(plan_log_cleanup(files, keep_versions=keep, min_age_s=0, now_s=1000))
    left = {f.name for f in files} - doomed
    commits = {int(n[:20]) for n in left if n.endswith(".json")}
    kept_cps = sorted(int(n[:20]) for n in left if ".checkpoint." in n)
    # the last `keep` versions are all still there
    assert set(range(max(0, latest - keep), latest + 1)) <= commits
    if doomed:
        # a reader can start at the oldest kept checkpoint and replay every later commit
        start = kept_cps[0]
        assert set(range(start + 1, latest + 1)) <= commits
        assert start <= latest - keep
        assert all(int(n[:20]) < start for n in doomed)
