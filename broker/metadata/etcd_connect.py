"""Connecting to etcd as a settings section describes it, with a few tries.

At start-up etcd may be starting too (a managed etcd beside new broker pods) or slow to answer
one handshake on a loaded node; a broker, proxy or Spark driver that gave up at once would fail
for a moment's delay. Every process that connects from settings comes through here.
"""

from __future__ import annotations

import asyncio
import logging

from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_channel import EtcdTls
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable
from kafscale.broker.metadata.etcd_versions import durability_warning
from kafscale.broker.store_settings import EtcdConnectionSettings

log = logging.getLogger(__name__)

STARTUP_ATTEMPTS = 3

_warned_versions: set[str] = set()


async def connect_etcd(
    config: EtcdConnectionSettings,
    attempts: int = STARTUP_ATTEMPTS,
    retry_level: int = logging.WARNING,
) -> Etcd:
    """The etcd client ``config`` describes; ``MetadataUnavailable`` after ``attempts`` tries
    (``BadEndpoint``, a setting that can never work, at once). Each failed try but the last is
    logged at ``retry_level``: a server's log shows them; a command's user wants its one line
    of error (``logging.DEBUG``), which the last failure makes."""
    for attempt in range(1, attempts + 1):
        try:
            return await _connect_once(config)
        except MetadataUnavailable as exc:
            if attempt == attempts:
                raise
            log.log(retry_level, "etcd not reachable yet (attempt %d): %s", attempt, exc)
            await asyncio.sleep(1)
    raise AssertionError("unreachable")


async def _connect_once(config: EtcdConnectionSettings) -> Etcd:
    return await Etcd.connect(
        config.endpoints,
        config.timeout_s,
        username=config.username,
        password=None if config.password is None else config.password.get_secret_value(),
        tls=EtcdTls(config.ca_file, config.cert_file, config.key_file),
    )


async def warn_of_durability_bugs(etcd: Etcd, level: int = logging.WARNING) -> None:
    """Log one line (at ``level``) if etcd's version is known to lose acknowledged writes on a crash
    (``etcd_versions``): once per process and version, since ``kafscale local`` runs several
    brokers in one process. Best effort: a Status call that fails is no reason not to start."""
    try:
        version = await etcd.server_version()
    except MetadataError as exc:
        log.debug("could not read etcd's version: %s", exc)
        return
    warning = durability_warning(version)
    if warning is not None and version not in _warned_versions:
        _warned_versions.add(version)
        log.log(level, "%s", warning)
