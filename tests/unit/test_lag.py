"""One lag formula, one lowest-committed-offset formula."""

from dataclasses import dataclass

from delta_log.core.lag import lag_sql, lowest_committed, partition_lag


def test_lag_counts_from_the_committed_offset():
    assert partition_lag(committed=40, log_start_offset=0, high_watermark=100) == 60


def test_lag_without_a_commit_counts_from_the_log_start_offset():
    assert partition_lag(committed=None, log_start_offset=30, high_watermark=100) == 70


def test_lag_of_a_commit_below_the_log_start_offset_counts_what_is_stored():
    assert partition_lag(committed=10, log_start_offset=30, high_watermark=100) == 70


def test_lag_is_never_negative():
    assert partition_lag(committed=120, log_start_offset=0, high_watermark=100) == 0


def test_the_sql_expression_is_the_same_formula():
    sql = lag_sql(committed="c", log_start_offset="l", high_watermark="h")
    assert sql == "greatest(0, h - greatest(coalesce(c, l), l))"


@dataclass
class C:
    topic: str
    partition: int
    offset: int


def test_lowest_committed_per_partition_of_one_topic():
    commits = [C("t", 0, 5), C("t", 0, 3), C("t", 1, 9), C("u", 0, 1)]
    assert lowest_committed(commits, "t") == {0: 3, 1: 9}
