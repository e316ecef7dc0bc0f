"""Our one adapter over the official Kubernetes client: apply, get, list, delete, patch status.

Objects are plain dicts. ``apply`` is server-side apply with the operator's stable field
manager (``kafscale-operator``, forced), so fields other managers own — an HPA's ``replicas``,
a user's annotations — are left alone. Forced apply takes over any object of that name, so
callers apply only over objects the cluster owns (see ``conflicts``), and ``create`` an object
that was absent when they looked: it fails (:class:`NameTaken`) if one has appeared since, where
an apply would take it over. ``write`` applies over an object the caller read with that
object's uid as a precondition: it fails (:class:`ObjectReplaced`) if the name no longer holds
it; ``apply`` takes that uid always, and so does the patch that follows a create's apply.
``delete`` too deletes only the object of the uid the caller checked. ``list_metadata`` lists a kind
with each object's metadata only, for callers that judge only whose an object is.
The client is synchronous; every call runs in a worker thread under the configured deadline.
The same connection settings feed kopf's login, so both talk to one API server with one
identity.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

from kafscale.operator.naming import FIELD_MANAGER
from kafscale.operator.settings import OperatorSettings

log = logging.getLogger(__name__)

# (apiVersion, kind) → plural, for every kind the operator touches.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("v1", "Pod"): "pods",
    ("apps/v1", "Deployment"): "deployments",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("cert-manager.io/v1", "Certificate"): "certificates",
    ("cert-manager.io/v1", "Issuer"): "issuers",
    ("kafscale.io/v1alpha1", "KafScaleCluster"): "kafscaleclusters",
    ("kafscale.io/v1alpha1", "KafScaleTopic"): "kafscaletopics",
    ("kafscale.io/v1alpha1", "KafScaleUser"): "kafscaleusers",
}

# Ask for a list of PartialObjectMetadata (meta.k8s.io/v1, as client-go's metadata client does),
# plain JSON from a server that does not serve it.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"


class KubeError(Exception):
    """The API server refused a request or could not be reached.

    ``fields``: the fields a refusal names (its Status ``details.causes``), e.g.
    ``metadata.uid`` for an apply whose uid precondition another object failed."""

    def __init__(
        self, message: str, status: int | None = None, fields: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.fields = fields


class NameChanged(KubeError):
    """The name no longer holds what the caller read there: nothing was written, and the
    caller reads the name again before it decides anything about it."""


class NameTaken(NameChanged):
    """``create`` found an object of that name (409 AlreadyExists): someone made it after the
    caller saw the name free. It is not applied over; the caller reads it again."""


class ObjectReplaced(NameChanged):
    """``write`` over an object the caller read found the name no longer holds that object
    (deleted, or deleted and made again by someone else) after the read: the apply carried the
    read object's uid, which the server refused, so the object now there was not touched."""


def _replaced(exc: KubeError, uid: str) -> ObjectReplaced:
    return ObjectReplaced(
        f"{exc}: not the object read (uid {uid}) any more: deleted or replaced meanwhile",
        exc.status,
        exc.fields,
    )


def refused_fields(body: Any) -> tuple[str, ...]:
    """Pure: the fields an API server's Status body names as causes (none: not such a body)."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else body
        causes = status["details"]["causes"]
        return tuple(str(cause["field"]) for cause in causes if cause.get("field"))
    except (ValueError, TypeError, KeyError, AttributeError):
        return ()


def uid_precondition_failed(error: KubeError) -> bool:
    """Pure: whether an apply carrying ``metadata.uid`` was refused for that uid.

    Checked on 1.20.2: the name holds no object, 409 Conflict ("uid mismatch ... no existing
    object was found"); it holds another object, 422 Invalid on ``metadata.uid`` ("field is
    immutable"). Any other refusal (a 422 on ``spec``, a 403) is the object's own error.
    """
    return error.status == 409 or (error.status == 422 and "metadata.uid" in error.fields)


def with_uid(manifest: dict[str, Any], uid: str) -> dict[str, Any]:
    """Pure: ``manifest`` applying only over the object of ``uid`` (a precondition; the uid
    is not a field any manager owns)."""
    return {**manifest, "metadata": {**manifest["metadata"], "uid": uid}}


def stray_update_entries(
    uid: str, managed_fields: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Pure: a JSON patch that removes the operator's ``Update`` entries from ``managedFields``
    of the object of ``uid`` (none: nothing to do), guarded by ``test`` ops so that it fails,
    touching nothing, on any other object of that name or after a concurrent change.

    A create (POST) records its fields under the operator's name with operation ``Update``,
    apart from the ``Apply`` entry server-side apply keeps. A field owned by that entry would
    outlive its removal from the operator's manifests (a broker setting taken out of the
    ConfigMap would stay), so after the first apply the entry goes: the object is then owned as
    if server-side apply had made it. The patch runs after the apply, as a request of its own:
    the name may hold another object by then (deleted and made again by a user), which the
    ``test`` of ``/metadata/uid`` keeps it off, as the apply's uid precondition does.
    """
    ops: list[dict[str, Any]] = []
    for index in reversed(range(len(managed_fields or []))):
        entry = (managed_fields or [])[index]
        if entry.get("manager") != FIELD_MANAGER or entry.get("operation") != "Update":
            continue
        path = f"/metadata/managedFields/{index}"
        ops += [
            {"op": "test", "path": f"{path}/manager", "value": FIELD_MANAGER},
            {"op": "test", "path": f"{path}/operation", "value": "Update"},
            {"op": "remove", "path": path},
        ]
    return [{"op": "test", "path": "/metadata/uid", "value": uid}, *ops] if ops else []


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    plural = PLURALS[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    return path if name is None else f"{path}/{name}"


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate (shared with kopf's login)."""

    server: str
    token: str | None = None
    ca_path: str | None = None
    insecure: bool = False
    certificate_path: str | None = None
    private_key_path: str | None = None


def load_configuration(settings: OperatorSettings) -> kubernetes.client.Configuration:
    """Explicit server, explicit kubeconfig, in-cluster service account, or ~/.kube/config."""
    config = kubernetes.client.Configuration()
    if settings.api_server:
        config.host = settings.api_server.rstrip("/")
        config.verify_ssl = False
        return config
    if settings.kubeconfig is not None:
        kubernetes.config.load_kube_config(
            config_file=str(settings.kubeconfig), client_configuration=config
        )
        return config
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        default = Path.home() / ".kube" / "config"
        kubernetes.config.load_kube_config(config_file=str(default), client_configuration=config)
    return config


def connection_of(config: kubernetes.client.Configuration) -> Connection:
    token = None
    auth = config.api_key.get("authorization") or config.api_key.get("BearerToken")
    if auth:
        token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
    return Connection(
        server=config.host,
        token=token,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


class Kube:
    def __init__(self, config: kubernetes.client.Configuration, timeout_s: float) -> None:
        self._client = kubernetes.client.ApiClient(config)
        self._timeout_s = timeout_s
        self.connection = connection_of(config)

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        response = self._client.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=self._timeout_s,
        )
        data = response.data
        return json.loads(data) if data else None

    async def _run(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s + 1):
                return await asyncio.to_thread(self._call, method, path, **kwargs)
        except ApiException as exc:
            message = f"{what} {path}: {exc.status} {exc.reason}"
            raise KubeError(message, exc.status, refused_fields(exc.body)) from exc
        except TimeoutError as exc:
            raise KubeError(f"{what} {path}: no answer within {self._timeout_s:g} s") from exc
        except OSError as exc:  # connection refused, DNS, TLS
            raise KubeError(f"{what} {path}: {exc}") from exc

    async def apply(self, manifest: dict[str, Any], *, uid: str) -> dict[str, Any]:
        """Server-side apply ``manifest`` as the operator's field manager over the object of
        ``uid`` and only over it; returns the object. :class:`ObjectReplaced` if the name holds
        another object, or none. (Without a uid a forced apply would create the object, or take
        over one of that name of any owner: there is no such call; a name the caller read free
        is for :meth:`create`.)"""
        meta = manifest["metadata"]
        path = resource_path(
            manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
        )
        try:
            result: dict[str, Any] = await self._run(
                "apply",
                "PATCH",
                path,
                body=with_uid(manifest, uid),
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                content_type="application/apply-patch+yaml",
            )
        except KubeError as exc:
            if uid_precondition_failed(exc):
                raise _replaced(exc, uid) from exc
            raise
        return await self._drop_stray_entries(path, result)

    async def _drop_stray_entries(self, path: str, applied: dict[str, Any]) -> dict[str, Any]:
        """Remove the create's ``Update`` entry from the object just applied (see
        :func:`stray_update_entries`), only while the name still holds it: a patch refused
        because the name holds another object, or none, is :class:`ObjectReplaced`."""
        uid = applied["metadata"]["uid"]
        stray = stray_update_entries(uid, applied["metadata"].get("managedFields"))
        if not stray:
            return applied
        try:
            result: dict[str, Any] = await self._run(
                "patch", "PATCH", path, body=stray, content_type="application/json-patch+json"
            )
        except KubeError as exc:
            if exc.status not in (404, 409, 422):  # 422: a ``test`` op failed
                raise
            now = await self.get_path(path)
            if now is not None and (now.get("metadata") or {}).get("uid") == uid:
                raise  # the same object, changed meanwhile: the next pass removes the entry
            raise _replaced(exc, uid) from exc
        return result

    async def write(self, manifest: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
        """:meth:`apply` over ``live`` (the caller's own object of that name, as it read it)
        and only over it (its uid), :meth:`create` where it read none.

        The caller judged ``live`` its own; a user may delete it and make their own of that
        name before the write, which a forced apply would take over."""
        if live is None:
            return await self.create(manifest)
        return await self.apply(manifest, uid=live["metadata"]["uid"])

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Make ``manifest`` only if no object has its name; :class:`NameTaken` if one has.

        Server-side apply has no "must not exist" precondition (a uid or resourceVersion in an
        apply is a "must exist" one), so: POST, which the server refuses with 409 when the name
        is taken, then apply the same manifest, so the object is owned as an applied one."""
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta["namespace"])
        try:
            created = await self._run(
                "create", "POST", path, body=manifest, query=[("fieldManager", FIELD_MANAGER)]
            )
        except KubeError as exc:
            if exc.status == 409:
                raise NameTaken(f"{exc}: made by someone else meanwhile", 409) from exc
            raise
        return await self.apply(manifest, uid=created["metadata"]["uid"])

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: Any, *, uid: str
    ) -> bool:
        """Merge ``status`` into the status of the object of ``uid`` (and only it: False when
        the name holds no object, or another one). For a pass outside the object's own kopf
        handlers (the Secret watch), which kopf's ``patch`` cannot write."""
        path = f"{resource_path(api_version, kind, namespace, name)}/status"
        body = {"metadata": {"uid": uid}, "status": status}
        try:
            await self._run(
                "patch", "PATCH", path, body=body, content_type="application/merge-patch+json"
            )
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def get_path(self, path: str) -> dict[str, Any] | None:
        """GET any API path (discovery, ``/version``); None when it does not exist."""
        try:
            result: dict[str, Any] = await self._run("get", "GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def get(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._run(
                "get", "GET", resource_path(api_version, kind, namespace, name)
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list_metadata(
        self, api_version: str, kind: str, namespace: str
    ) -> list[dict[str, Any]]:
        """Every object of the kind in the namespace, metadata only (name, uid, labels, owner
        references...: each a ``PartialObjectMetadata``, without ``spec``, ``data`` or
        ``status``).

        A whole-kind list in a namespace full of other applications' Deployments and Services
        would otherwise carry every one of their specs and statuses (pod templates...) to an
        operator that reads only whose each object is. A server that cannot answer with
        metadata only (1.15+ can) answers with whole objects (:data:`METADATA_LIST` falls back
        to plain JSON), whose metadata is the same."""
        result = await self._run(
            "list", "GET", resource_path(api_version, kind, namespace), accept=METADATA_LIST
        )
        items: list[dict[str, Any]] = (result or {}).get("items") or []
        return items

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        result = await self._run(
            "list", "GET", resource_path(api_version, kind, namespace), query=query
        )
        items: list[dict[str, Any]] = (result or {}).get("items") or []
        return items

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, *, uid: str
    ) -> bool:
        """Delete the object of ``uid`` with background propagation; False if the name holds
        no object, or another (the server answers 409 when the name has meanwhile been given
        to another object). There is no delete by name alone: it would delete whatever holds
        the name now, a user's object made since the caller judged it."""
        body: dict[str, Any] = {"propagationPolicy": "Background", "preconditions": {"uid": uid}}
        try:
            await self._run(
                "delete", "DELETE", resource_path(api_version, kind, namespace, name), body=body
            )
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True
