"""DescribeLogDirs through the proxy: the brokers' answers as the one broker clients see.

Each broker reports one log dir (its store) with the partitions it owns. Behind one proxy a
client sees one broker, which holds every partition: the proxy asks every live broker and joins
their answers per log dir name. Brokers of a cluster share one store, so that is one dir with
every owned partition in it; a partition that moved between two answers (a handoff) is given
once, from the first answer that has it. Pure: entities in, a response body out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kafscale.broker.protocol.errors import ErrorCode

Body = dict[str, Any]


def merge_log_dirs(responses: Iterable[Any]) -> Body:
    """One DescribeLogDirs response body from the brokers' parsed responses (any version)."""
    dirs: dict[str, Body] = {}
    partitions: dict[str, dict[tuple[str, int], Body]] = {}
    errors: list[ErrorCode] = []
    answered = False
    for response in responses:
        code = ErrorCode(int(getattr(response, "error_code", ErrorCode.NONE)))
        if code is not ErrorCode.NONE:
            errors.append(code)
            continue
        answered = True
        for result in response.results:
            name = str(result.log_dir)
            merged = dirs.setdefault(name, _empty_dir(result))
            if merged["error_code"] == ErrorCode.NONE:
                merged["error_code"] = ErrorCode(int(result.error_code))
            kept = partitions.setdefault(name, {})
            for topic in result.topics:
                for p in topic.partitions:
                    kept.setdefault((str(topic.name), int(p.partition_index)), _partition(p))
    for name, merged in dirs.items():
        merged["topics"] = _topics(partitions[name])
    error = ErrorCode.NONE if answered or not errors else errors[0]
    return {"throttle_time": 0, "error_code": error, "results": list(dirs.values())}


def _empty_dir(result: Any) -> Body:
    return {
        "error_code": ErrorCode.NONE,
        "log_dir": str(result.log_dir),
        "topics": [],
        "total_bytes": int(getattr(result, "total_bytes", -1)),
        "usable_bytes": int(getattr(result, "usable_bytes", -1)),
    }


def _partition(p: Any) -> Body:
    return {
        "partition_index": int(p.partition_index),
        "partition_size": int(p.partition_size),
        "offset_lag": int(p.offset_lag),
        "is_future_key": bool(p.is_future_key),
    }


def _topics(partitions: dict[tuple[str, int], Body]) -> list[Body]:
    by_topic: dict[str, list[Body]] = {}
    for (topic, _), body in sorted(partitions.items()):
        by_topic.setdefault(topic, []).append(body)
    return [{"name": name, "partitions": parts} for name, parts in by_topic.items()]
