"""KafScale: Kafka-compatible streaming on stateless brokers.

The component folders at the repository root (``broker/``, ``operator/``, ``pipeline/``) are the
subpackages of this one import root; ``src/kafscale`` only links them together so that no
top-level package named ``operator`` ever shadows the standard library.
"""

__version__ = "0.1.0"
