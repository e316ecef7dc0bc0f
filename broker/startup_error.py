"""The error that ends a process at start-up with a message and a non-zero exit.

A module of its own so that the CLI can catch it without importing the broker (``app``), which
commands such as ``drain`` (a pod's preStop hook), ``users`` or ``--help`` do not need.
"""

from __future__ import annotations


class StartupError(Exception):
    """A dependency is missing or unreachable; the process must exit non-zero."""


class SettingError(StartupError):
    """A setting names something start-up found unusable only on trying it (an
    ``--etcd-binary`` that exited before serving): one line and exit status 2, as a bad
    setting found before the start."""


class RunError(Exception):
    """A part the process depends on ended while it ran (``kafscale local``'s etcd): after the
    stop, the message is one line on stderr and the exit status 1."""
