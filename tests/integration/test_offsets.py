import pytest

from delta_log import OffsetCommit, OffsetStore, StorageRoot
from delta_log.errors import InvalidOffsetError


def test_commit_many_latest_wins_and_survives_restart(storage):
    s = OffsetStore(storage)
    v = s.commit(
        [
            OffsetCommit(group="g", topic="a", partition=0, offset=5, commit_timestamp_us=1),
            OffsetCommit(group="g", topic="a", partition=1, offset=7, commit_timestamp_us=1),
            OffsetCommit(group="h", topic="a", partition=0, offset=1, commit_timestamp_us=1),
        ]
    )
    s.commit([OffsetCommit(group="g", topic="a", partition=0, offset=9, metadata="m", commit_timestamp_us=2)])
    assert s._dt.version() == v + 1
    restarted = OffsetStore(StorageRoot(storage.root))
    got = {k: c.offset for k, c in restarted.committed("g").items()}
    assert got == {("a", 0): 9, ("a", 1): 7}
    assert restarted.committed("g")[("a", 0)].metadata == "m"
    assert restarted.groups() == ["g", "h"]


def test_other_server_commits_visible_after_load(storage):
    a, b = OffsetStore(storage), OffsetStore(storage)
    b.commit([OffsetCommit(group="g", topic="a", partition=0, offset=3, commit_timestamp_us=5)])
    a.load()
    assert a.committed("g")[("a", 0)].offset == 3


@pytest.mark.parametrize(
    "bad",
    [
        OffsetCommit(group="", topic="a", partition=0, offset=1),
        OffsetCommit(group="g", topic="a b", partition=0, offset=1),
        OffsetCommit(group="g", topic="a", partition=-1, offset=1),
        OffsetCommit(group="g", topic="a", partition=0, offset=-5),
    ],
)
def test_bad_commits_write_nothing(storage, bad):
    s = OffsetStore(storage)
    before = s._dt.version()
    with pytest.raises(Exception) as e:
        s.commit([OffsetCommit(group="g", topic="a", partition=0, offset=1), bad])
    assert getattr(e.value, "code", None) in {"INVALID_OFFSET", "INVALID_TOPIC"}
    assert not isinstance(e.value, InvalidOffsetError) or e.value.code == "INVALID_OFFSET"
    assert OffsetStore(storage)._dt.version() == before
