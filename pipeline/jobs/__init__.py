"""Pipeline jobs built on the data source, runnable with ``python -m`` or ``spark-submit``."""
