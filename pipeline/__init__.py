"""The PySpark data source and pipeline jobs (a later issue)."""
