"""Observability: Prometheus metrics, consumer lag, structured logs, the ``status`` command."""
