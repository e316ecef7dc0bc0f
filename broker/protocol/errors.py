"""Kafka error codes the broker answers with, and the domain exceptions that map onto them.

Domain code raises these exceptions (or returns the codes per partition); the one mapping from
exception to code is ``code_for``. The numbers are Kafka's own (see the protocol guide).
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    UNKNOWN_PRODUCER_ID = 59
    KAFKA_STORAGE_ERROR = 56
    LOG_DIR_NOT_FOUND = 57
    # authentication (SASL) and user credentials
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    SASL_AUTHENTICATION_FAILED = 58
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    INVALID_UPDATE_VERSION = 95
    # delegation tokens (KIP-48)
    DELEGATION_TOKEN_AUTH_DISABLED = 61
    DELEGATION_TOKEN_NOT_FOUND = 62
    DELEGATION_TOKEN_OWNER_MISMATCH = 63
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = 64
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = 65
    DELEGATION_TOKEN_EXPIRED = 66
    INVALID_PRINCIPAL_TYPE = 67
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    INVALID_RECORD = 87
    UNKNOWN_TOPIC_ID = 100
    INCONSISTENT_TOPIC_ID = 103
    # transactions: the coordinator's answers
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    OPERATION_NOT_ATTEMPTED = 55
    TRANSACTION_COORDINATOR_FENCED = 52
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90
    TRANSACTIONAL_ID_NOT_FOUND = 105
    # consumer groups (KIP-848)
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    INVALID_REGULAR_EXPRESSION = 130
    # share groups (KIP-932)
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    SHARE_SESSION_LIMIT_REACHED = 133


class KafkaError(Exception):
    """A failure with a Kafka error code; ``message`` goes into error_message fields."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        if code is not None:
            self.code = code


class UnknownTopicOrPartition(KafkaError):
    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class NotLeader(KafkaError):
    """This broker does not hold the partition's lease (or is handing it over)."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class NotCoordinator(KafkaError):
    code = ErrorCode.NOT_COORDINATOR


class CoordinatorBetweenSessions(NotCoordinator):
    """This broker's etcd session ended (paused, partitioned, etcd electing a leader) and its
    next one is not up yet: it coordinates nothing meanwhile, and is most often the group's
    coordinator again a moment later. NOT_COORDINATOR, but OffsetFetch answers
    COORDINATOR_LOAD_IN_PROGRESS (``api/group_offsets``)."""


class MetadataTimeout(KafkaError):
    """etcd could not be reached in time: never proceed as if it had answered."""

    code = ErrorCode.REQUEST_TIMED_OUT


class StorageFailure(KafkaError):
    code = ErrorCode.KAFKA_STORAGE_ERROR


class ObjectGone(StorageFailure):
    """An object the state located was deleted under the read: the state read from is older
    than a compaction pass's delayed delete or a retention step. A caller holding a newer state
    reads again from it (``api.fetch``); otherwise KAFKA_STORAGE_ERROR, which clients retry."""


class CorruptMessage(KafkaError):
    code = ErrorCode.CORRUPT_MESSAGE


class OffsetOutOfRange(KafkaError):
    code = ErrorCode.OFFSET_OUT_OF_RANGE


class InvalidRequest(KafkaError):
    code = ErrorCode.INVALID_REQUEST


class UnreadableRecord(KafkaError):
    """A value stored in etcd that does not decode (garbage bytes, JSON of another shape): the
    one group it belongs to cannot be served, every other one can. UNKNOWN_SERVER_ERROR, not a
    retriable code: a client would retry for ever what only an operator can repair."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


# The per-partition codes of a Fetch or ShareFetch answer that the Java consumer handles
# (``FetchCollector`` and ``ShareFetchCollector.handleInitializeErrors``, kafka-clients 3.x-4.x):
# it retries, resets or throws a typed exception on these, and throws
# IllegalStateException("Unexpected error code N while fetching ...") out of the
# application's poll() on any other, REQUEST_TIMED_OUT included.
FETCH_PARTITION_CODES = frozenset(
    {
        ErrorCode.NONE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.INCONSISTENT_TOPIC_ID,
        ErrorCode.OFFSET_OUT_OF_RANGE,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_SERVER_ERROR,
        ErrorCode.CORRUPT_MESSAGE,
    }
)


# Fetch v6 is the first a client must understand KAFKA_STORAGE_ERROR in (FetchResponse.json).
FIRST_STORAGE_ERROR_FETCH_VERSION = 6


def fetch_partition_code(
    code: ErrorCode, fetch_version: int = FIRST_STORAGE_ERROR_FETCH_VERSION
) -> ErrorCode:
    """What a Fetch (of ``fetch_version``) or ShareFetch partition answers for ``code``: ``code``
    itself if consumers handle it there, else KAFKA_STORAGE_ERROR ("the log cannot be read
    here now", what Kafka answers for an offline log directory). Every client retries that: the
    Java consumer, librdkafka and kafka-python after a metadata refresh, aiokafka after its
    backoff. What it replaces is above all REQUEST_TIMED_OUT, an etcd that did not answer in
    time, which the Java consumer throws out of poll() and librdkafka hands the application
    as an error. Fetch v0-v5 get NOT_LEADER_OR_FOLLOWER for it instead, as Kafka answers them
    (``maybeDownConvertStorageError``): their clients may not know the code."""
    if code not in FETCH_PARTITION_CODES:
        code = ErrorCode.KAFKA_STORAGE_ERROR
    if code is ErrorCode.KAFKA_STORAGE_ERROR and fetch_version < FIRST_STORAGE_ERROR_FETCH_VERSION:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return code


def code_for(exc: BaseException) -> ErrorCode:
    if isinstance(exc, KafkaError):
        return exc.code
    if isinstance(exc, TimeoutError):
        return ErrorCode.REQUEST_TIMED_OUT
    return ErrorCode.UNKNOWN_SERVER_ERROR
