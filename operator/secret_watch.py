"""Pure: which clusters and users a changed Secret concerns, and whether it calls for a pass.

The operator watches Secrets (a kopf event handler on ``v1/secrets``) so that one a cluster's
pods read that is broken, fixed, replaced or deleted after the cluster's last pass is acted on
at once, not at the next resync (``RESYNC_INTERVAL_S``, 5 min): a user's Secret that breaks
makes the cluster ``Degraded``/``SecretUnusable``, a fixed one clears it, a deleted
operator-made one is made again. The watch sees every Secret of the served namespaces; only
those of the names a cluster's last pass judged (:attr:`UnusableSecrets.read`) are looked at
further, and a pass runs only when the change makes a difference to what was judged
(:meth:`UnusableSecrets.reapply_due`), so the operator's own writes start none. Likewise a
KafScaleUser's password Secret (:class:`UserSecret`): the user's own, named by
``valueFrom.secretKeyRef``, changed or deleted, or the operator's deleted or taken over, runs
the user's round at once (its credential follows the password, or ``Ready`` says why not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafscale.operator.models import ClusterRef
from kafscale.operator.ownership import owned_by
from kafscale.operator.secret_usability import Manifest, UnusableSecrets
from kafscale.operator.users import SECRET_PASSWORD_KEY, password_from_ref

ClusterKey = tuple[str, str, str]  # (namespace, name, uid): one cluster, not its name's next
UserKey = tuple[str, str]  # a KafScaleUser's (namespace, name)

# Server-side filter of the Secret watch: the kinds no cluster reads and that are many and
# large (a service account's tokens, each Helm release's history), so never sent.
WATCH_FIELD_SELECTOR = "type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1"


def clusters_reading(
    judged: Mapping[ClusterKey, UnusableSecrets], namespace: str, name: str
) -> list[ClusterKey]:
    """The clusters of ``namespace`` whose pods read the Secret ``name``, as last judged."""
    return [key for key, secrets in judged.items() if key[0] == namespace and name in secrets.read]


def clusters_to_reapply(
    judged: Mapping[ClusterKey, UnusableSecrets],
    namespace: str,
    name: str,
    secret: Manifest | None,
) -> list[ClusterKey]:
    """The clusters whose objects the Secret ``name`` of ``namespace``, now ``secret`` (None:
    deleted), calls to be applied again (:meth:`UnusableSecrets.reapply_due`)."""
    return [
        key
        for key in clusters_reading(judged, namespace, name)
        if judged[key].reapply_due(_ref(key), name, secret)
    ]


def _ref(key: ClusterKey) -> ClusterRef:
    namespace, name, uid = key
    return ClusterRef(namespace=namespace, name=name, uid=uid)


@dataclass(frozen=True)
class UserSecret:
    """The Secret a KafScaleUser's password comes from, as the user's last round named it."""

    name: str
    user_uid: str
    own: bool  # the operator writes it (else the user's, named by ``valueFrom.secretKeyRef``)

    def round_due(self, secret: Manifest | None) -> bool:
        """Whether the Secret, now ``secret`` (None: deleted), calls for the user's round: the
        user's own changed at all (its password may have) or went; the operator's went, was
        taken over or lost its password. The operator's own write, which keeps the password,
        does not."""
        if not self.own or secret is None:
            return True
        return not owned_by(secret, self.user_uid) or not password_from_ref(
            secret, SECRET_PASSWORD_KEY
        )


def users_reading(users: Mapping[UserKey, UserSecret], namespace: str, name: str) -> list[UserKey]:
    """The KafScaleUsers of ``namespace`` whose password comes from the Secret ``name``."""
    return [key for key, read in users.items() if key[0] == namespace and read.name == name]


def users_to_resync(
    users: Mapping[UserKey, UserSecret], namespace: str, name: str, secret: Manifest | None
) -> list[UserKey]:
    """The KafScaleUsers whose round the Secret ``name`` of ``namespace``, now ``secret``
    (None: deleted), calls for (:meth:`UserSecret.round_due`)."""
    return [key for key in users_reading(users, namespace, name) if users[key].round_due(secret)]
