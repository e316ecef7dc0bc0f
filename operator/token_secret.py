"""The cluster's delegation-token key Secret: made once, never rotated by the operator.

The key signs every token (HMAC-SHA512 of its id); a new key would end every existing token,
so the operator writes the Secret only when it is missing. A Secret of that name
the cluster does not own is the user's own key, used as it is. Owned by the cluster, it goes
with it (a re-created cluster gets a new key: tokens of the old one then stop logging in).
"""

from __future__ import annotations

import base64
import logging
import secrets
from typing import Any

from kafscale.operator import naming
from kafscale.operator.kube import Kube
from kafscale.operator.manifest_pods import Manifest
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata, owned_by
from kafscale.operator.secret_writes import SecretsPass, decide_and_write

log = logging.getLogger(__name__)

KEY_BYTES = 48


def build_token_secret(ref: ClusterRef, key: str) -> Manifest:
    """The Secret holding ``key`` under ``naming.DELEGATION_TOKEN_KEY``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_metadata(
            ref, naming.delegation_token_secret_name(ref.name), naming.CONFIG
        ),
        "type": "Opaque",
        "data": {naming.DELEGATION_TOKEN_KEY: base64.b64encode(key.encode()).decode()},
    }


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


async def ensure_token_secret(
    kube: Kube, ref: ClusterRef, spec: KafScaleClusterSpec
) -> SecretsPass:
    """Make the key Secret if tokens are on and it does not exist: the name written, or the
    Secret of another owner found under it (the user's key, used as it is, judged by
    :mod:`secret_usability`).

    A Secret made under the name between the read and the create (the create refuses to
    replace it) is read again: the user's key, used as it is (:mod:`secret_writes`)."""
    if not spec.delegation_tokens.enabled:
        return SecretsPass()
    name = naming.delegation_token_secret_name(ref.name)

    async def decide(secret: dict[str, Any] | None) -> SecretsPass:
        if secret is not None and owned_by(secret, ref.uid):
            return SecretsPass()  # the cluster's own key, never rotated
        if secret is not None:
            return SecretsPass(found={name: secret})  # the user's
        await kube.create(build_token_secret(ref, new_key()))
        log.info("made the delegation-token key Secret %s/%s", ref.namespace, name)
        return SecretsPass([name])

    return await decide_and_write(kube, ref.namespace, name, decide)
