"""The pipeline suite shares one SparkSession (``harness.spark``)."""

from harness.spark import spark

__all__ = ["spark"]
