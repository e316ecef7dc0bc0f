"""``format("kafscale")``: the PySpark data source (Spark 4's Python Data Source API).

Reads go straight to object storage: the driver plans from etcd's committed partition states
(``catalog``, ``planning``), executors GET segment objects and decode them to Arrow
(``fetch``, ``decode``). Writes produce through the Kafka protocol (``writer``). Columns and
options are those of Spark's own Kafka source, so a Kafka job ports by changing the format name
and the connection options.

This module is what every Python process Spark starts for the source imports first: the
process that resolves the format, each query's planner processes on the driver, and the
executors' workers (the tasks they unpickle are its ``TaskReader`` and ``TaskPartition``).
Spark gives a new process 10 s to connect back, which a loaded host can miss, so it imports
pyspark and nothing heavy of ours: the driver's readers (``readers``: etcd, planning), the
executors' reading (``fetch``: the store, the decoder) and the writer are imported where
used (``tests/unit/test_startup_imports.py`` keeps it so).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafscale.pipeline.process import freeze_imports_once

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

    from kafscale.broker.store_settings import EtcdSettings
    from kafscale.pipeline.options import TaskReading
    from kafscale.pipeline.planning import ReadTask

NAME = "kafscale"


def spark_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema, column for column."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class KafScaleDataSource(DataSource):
    """Topics of a KafScale cluster as a Spark source and sink."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        freeze_imports_once()  # the first call in each of Spark's create_data_source processes
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return spark_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        from kafscale.pipeline.options import parse_read_options
        from kafscale.pipeline.readers import BatchReader

        options = parse_read_options(self.options, streaming=False)
        self._forget_driver_options()
        return BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from kafscale.pipeline.options import parse_read_options
        from kafscale.pipeline.readers import StreamReader

        options = parse_read_options(self.options, streaming=True)
        self._forget_driver_options()
        return StreamReader(options)

    def _forget_driver_options(self) -> None:
        """Drop the etcd options once parsed. pyspark's planner pickles this instance into the
        read function it sends to every task (for error messages that name the source), so
        what it holds reaches the executors; they only read the object store."""
        for name in [name for name in self.options if name.lower().startswith("etcd.")]:
            del self.options[name]

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from kafscale.pipeline.writer import KafScaleWriter, parse_write_options

        return KafScaleWriter(parse_write_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from kafscale.pipeline.writer import KafScaleStreamWriter, parse_write_options

        return KafScaleStreamWriter(parse_write_options(self.options, schema))


class TaskPartition(InputPartition):
    """A ``ReadTask`` as Spark's input partition.

    ``etcd``: the driver's etcd settings, given only to the tasks of compacted topics. A
    compaction pass may supersede and delete the objects such a task planned to read before it
    reads them (Spark's retries reuse the plan), and then the task re-locates its offsets from
    the partition's current state in etcd (``fetch.read_task``). Other tasks never need etcd,
    so their partitions carry none of its settings."""

    def __init__(self, task: ReadTask, etcd: EtcdSettings | None = None) -> None:
        super().__init__(task)
        self.task = task
        self.etcd = etcd


def read_partition(reading: TaskReading, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """One task's rows, on an executor: the store and the decoder are imported at its first."""
    from kafscale.pipeline.fetch import read_task

    assert isinstance(partition, TaskPartition)
    return read_task(reading, partition.task, partition.etcd)


class TaskReader(DataSourceReader):
    """What a batch reader becomes when Spark pickles it for the executors: ``read`` only,
    with the store's settings and no etcd ones (only the driver plans, from etcd)."""

    def __init__(self, reading: TaskReading) -> None:
        self.reading = reading

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.reading, partition)


class TaskStreamReader(DataSourceStreamReader):
    """``TaskReader`` for a stream: the executors' side of ``StreamReader``."""

    def __init__(self, reading: TaskReading) -> None:
        self.reading = reading

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.reading, partition)
