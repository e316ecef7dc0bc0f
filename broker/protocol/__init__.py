"""Kafka wire protocol: framing, headers, the API table and the one module that wraps kio."""
