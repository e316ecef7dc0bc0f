"""``format("kafscale")`` without a registration call.

pyspark looks for top-level modules named ``pyspark_<name>`` and registers their
``DefaultSource``; this one is installed with the ``kafscale`` distribution (the data source
itself lives in ``kafscale.pipeline``).
"""

from kafscale.pipeline.source import KafScaleDataSource as DefaultSource

__all__ = ["DefaultSource"]
