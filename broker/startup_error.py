"""The error that ends a process at start-up with a message and a non-zero exit.

A module of its own so that the CLI can catch it without importing the broker (``app``), which
commands such as ``drain`` (a pod's preStop hook), ``users`` or ``--help`` do not need.
"""

from __future__ import annotations


class StartupError(Exception):
    """A dependency is missing or unreachable; the process must exit non-zero."""
