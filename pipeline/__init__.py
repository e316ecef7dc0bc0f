"""The PySpark data source (``format("kafscale")``) and the pipeline jobs built on it.

``spark.read.format("kafscale")`` works without a call once the package is installed (pyspark
registers the top-level ``pyspark_kafscale`` module); ``register(spark)`` does the same
explicitly, e.g. where the package is shipped to a cluster as a zip on ``--py-files``.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register ``format("kafscale")`` with ``spark`` (a SparkSession)."""
    from kafscale.pipeline.source import KafScaleDataSource

    spark.dataSource.register(KafScaleDataSource)
