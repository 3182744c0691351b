"""The race and crash tests of a local root, run again with the root on a real S3 server: Delta's
commits there rely on S3 conditional writes (put-if-absent), with no lock service.

The tests are the integration suite's own functions; the fixtures (an S3 root) are this folder's.
"""

from tests.integration.test_race_and_crash import (
    test_sigkill_mid_stream_loses_nothing_acked,
    test_two_processes_same_partition,
)
from tests.integration.test_retention import test_retention_removes_expired_prefix_beside_a_live_writer
from tests.integration.test_rollup import test_rollup_beside_a_live_writer, test_two_rollers_race_without_doubling
from tests.integration.test_schema_store import (
    test_a_change_that_loses_a_race_plans_again_on_the_winners_state,
    test_two_writers_race_for_ids_and_versions,
)

__all__ = [
    "test_a_change_that_loses_a_race_plans_again_on_the_winners_state",
    "test_retention_removes_expired_prefix_beside_a_live_writer",
    "test_rollup_beside_a_live_writer",
    "test_sigkill_mid_stream_loses_nothing_acked",
    "test_two_processes_same_partition",
    "test_two_rollers_race_without_doubling",
    "test_two_writers_race_for_ids_and_versions",
]
