"""Kafka API handlers, one module per family, registered in one table."""
