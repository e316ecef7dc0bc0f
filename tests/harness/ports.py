"""Runs of consecutive free ports for `kafscale local` (brokers listen on --port, --port + 1...).

The helper is ``kafscale.broker.child_process.free_port_run`` (shared with the benches): it
picks below the kernel's ephemeral range, so that no other process's port-0 socket can take a
chosen port between the probe and the bind.
"""

from __future__ import annotations

from kafscale.broker.child_process import free_port_run

__all__ = ["free_port_run"]
