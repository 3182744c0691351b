"""The Kafka face's one table from topiclake's error root to Kafka's error codes.

Every error a service raises reaches a Kafka client as Kafka's own code for it (and, where the
response has one, the error's message, which says what to do). Classes are looked up along their
MRO, so a subclass without its own row takes its parent's.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from delta_log import errors as e

CODES: dict[type[e.TopiclakeError], ErrorCode] = {
    e.TopiclakeError: ErrorCode.unknown_server_error,
    e.InvalidTopicError: ErrorCode.invalid_topic_exception,
    e.TopicNotFoundError: ErrorCode.unknown_topic_or_partition,
    e.TopicExistsError: ErrorCode.topic_already_exists,
    e.PartitionNotFoundError: ErrorCode.unknown_topic_or_partition,
    e.InvalidConfigError: ErrorCode.invalid_config,
    e.InvalidPartitionsError: ErrorCode.invalid_partitions,
    e.InvalidRecordError: ErrorCode.invalid_record,
    e.CorruptRecordError: ErrorCode.corrupt_message,
    e.UnsupportedCompressionError: ErrorCode.unsupported_compression_type,
    e.UnsupportedMessageFormatError: ErrorCode.unsupported_for_message_format,
    e.ProducerFencedError: ErrorCode.producer_fenced,
    e.InvalidProducerIdMappingError: ErrorCode.invalid_producer_id_mapping,
    e.InvalidTxnStateError: ErrorCode.invalid_txn_state,
    e.InvalidTransactionTimeoutError: ErrorCode.invalid_transaction_timeout,
    e.ConcurrentTransactionsError: ErrorCode.concurrent_transactions,
    e.TransactionalIdNotFoundError: ErrorCode.transactional_id_not_found,
    e.UnstableOffsetCommitError: ErrorCode.unstable_offset_commit,
    e.InvalidSchemaError: ErrorCode.invalid_record,
    e.InvalidTimestampError: ErrorCode.invalid_timestamp,
    e.RecordTooLargeError: ErrorCode.message_too_large,
    e.RequestTooLargeError: ErrorCode.record_list_too_large,
    e.OffsetOutOfRangeError: ErrorCode.offset_out_of_range,
    e.InvalidOffsetError: ErrorCode.offset_out_of_range,
    e.OffsetMetadataTooLargeError: ErrorCode.offset_metadata_too_large,
    e.DuplicateSequenceError: ErrorCode.duplicate_sequence_number,
    e.OutOfOrderSequenceError: ErrorCode.out_of_order_sequence_number,
    e.CommitConflictError: ErrorCode.request_timed_out,
    e.StorageUnavailableError: ErrorCode.kafka_storage_error,
    e.WriteAheadGapError: ErrorCode.kafka_storage_error,
    e.BackPressureError: ErrorCode.request_timed_out,
    e.WriterClosedError: ErrorCode.request_timed_out,
    e.AuthenticationError: ErrorCode.sasl_authentication_failed,
    e.AuthorizationError: ErrorCode.topic_authorization_failed,
    e.TransactionalIdAuthorizationError: ErrorCode.transactional_id_authorization_failed,
    e.UnknownGroupError: ErrorCode.group_id_not_found,
    e.UnknownGroupMemberError: ErrorCode.unknown_member_id,
    e.UnknownMemberError: ErrorCode.unknown_member_id,
    e.NotCoordinatorError: ErrorCode.not_coordinator,
    e.CoordinatorNotAvailableError: ErrorCode.coordinator_not_available,
    e.OwnerNotAvailableError: ErrorCode.not_leader_or_follower,
    e.NotPartitionOwnerError: ErrorCode.not_leader_or_follower,
    e.PartitionRecoveringError: ErrorCode.not_leader_or_follower,
    e.FencedMemberError: ErrorCode.illegal_generation,
    e.MemberIdRequiredError: ErrorCode.member_id_required,
    e.GroupMaxSizeReachedError: ErrorCode.group_max_size_reached,
    e.FencedInstanceIdError: ErrorCode.fenced_instance_id,
    e.UnknownAssignorError: ErrorCode.inconsistent_group_protocol,
    e.FencedMemberEpochError: ErrorCode.fenced_member_epoch,
    e.StaleMemberEpochError: ErrorCode.stale_member_epoch,
    e.UnreleasedInstanceIdError: ErrorCode.unreleased_instance_id,
    e.UnsupportedAssignorError: ErrorCode.unsupported_assignor,
    e.InvalidRegularExpressionError: ErrorCode.invalid_regular_expression,
    e.InvalidGroupRequestError: ErrorCode.invalid_request,
    e.InconsistentGroupProtocolError: ErrorCode.inconsistent_group_protocol,
    e.RebalanceInProgressError: ErrorCode.rebalance_in_progress,
    e.GroupNotEmptyError: ErrorCode.non_empty_group,
    e.GroupSubscribedToTopicError: ErrorCode.group_subscribed_to_topic,
    e.InvalidGroupError: ErrorCode.invalid_group_id,
    e.ReplicaStateError: ErrorCode.policy_violation,
    e.SchemaValidationError: ErrorCode.invalid_record,
}


def code_of(exc: BaseException) -> ErrorCode:
    """Kafka's code for an error (UNKNOWN_SERVER_ERROR for anything outside the root)."""
    if isinstance(exc, e.AuthorizationError) and "group" in exc.details:
        return ErrorCode.group_authorization_failed
    for cls in type(exc).__mro__:
        code = CODES.get(cls)
        if code is not None:
            return code
    return ErrorCode.unknown_server_error


def message_of(exc: BaseException) -> str:
    """What a client may be told: a TopiclakeError's own message; never an internal one's text."""
    if isinstance(exc, e.TopiclakeError):
        return exc.message
    return "The server failed to handle this request; see its log."
