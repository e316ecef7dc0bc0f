"""A Kubernetes API emulator for the operator tests: kmock's emulator with the gaps filled.

kmock (by kopf's author) serves a real HTTP Kubernetes API from memory, and kopf's watches work
against it. Version 0.8 lacks what kopf and our operator rely on; this subclass adds:

* ``metadata.uid``, ``resourceVersion`` (bumped on every change), ``generation`` (bumped when
  anything but metadata/status changes) and ``creationTimestamp``;
* JSON-patch ``test`` failures answered with 422 (kopf's optimistic finalizer patches);
* the ``status`` subresource: ``/status`` writes only status, the main endpoint never does;
* the ``scale`` subresource (GET and PATCH ``/scale``, as ``kubectl scale`` and an HPA use it);
* server-side apply (``application/apply-patch+yaml``): create if absent, else replace the
  applied top-level fields (metadata maps merged, status kept);
* owner-reference garbage collection (background cascade), and core discovery that says
  ``groupVersion: v1``.

Fixtures: ``kube_api`` (the emulator on a free port, our resources declared); read stored
objects with ``kube_api.read(resource, namespace, name)``. Every request made by the
operator stays recorded in ``kube_api.requests``.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import pytest_asyncio
from kmock._internal import enums, k8s, rendering

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
_KEEP_ON_APPLY = ("metadata", "status", "apiVersion", "kind")


@attrs.frozen
class ScalePaths:
    spec_replicas: str  # e.g. ".spec.brokers.replicas"
    status_replicas: str
    label_selector: str | None = None


def _get_path(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.strip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.strip(".").split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class KubeEmulator(k8s.KubernetesEmulator):
    scales: dict[kmock.resource, ScalePaths] = attrs.field(factory=dict)
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _last_version: int = attrs.field(default=0, init=False)
    _history: list[tuple[int, kmock.resource, dict[str, Any]]] = attrs.field(
        factory=list, init=False
    )

    # --- helpers ------------------------------------------------------------------------

    def _has_subresource(self, resource: kmock.resource, sub: str) -> bool:
        return resource in self.resources and sub in self.resources[resource].subresources

    def _stamp(self, obj: dict[str, Any], *, spec_changed: bool) -> None:
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._versions))
        if spec_changed:
            meta["generation"] = int(meta.get("generation") or 0) + 1

    async def _publish(self, resource: kmock.resource, kind: str, raw: dict[str, Any]) -> None:
        event: dict[str, Any] = {"type": kind, "object": copy.deepcopy(raw)}
        if kind == "DELETED":  # a deletion is a change with a version of its own
            event["object"]["metadata"]["resourceVersion"] = str(next(self._versions))
        version = int(event["object"]["metadata"]["resourceVersion"])
        self._last_version = max(self._last_version, version)
        self._history.append((version, resource, event))
        await self._buses[resource].put(event)

    def _new_object(self, resource: kmock.resource, request: rendering.Request) -> dict[str, Any]:
        data = copy.deepcopy(request.data)
        meta = data.setdefault("metadata", {})
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        if self._has_subresource(resource, "status"):
            data.pop("status", None)
        data["metadata"]["generation"] = 0
        self._stamp(data, spec_changed=True)
        return dict(data)

    async def _create(self, resource: kmock.resource, request: rendering.Request) -> Any:
        data = self._new_object(resource, request)
        key = (resource, data["metadata"].get("namespace"), data["metadata"]["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise k8s.KubernetesObjectConflictError()
        if key in self._objects:
            self._objects[key].create(data)
        else:
            self._objects[key] = data
        await self._publish(resource, "ADDED", self._objects[key].raw)
        return key

    async def _modify(self, key: Any, new: dict[str, Any], *, spec_changed: bool) -> None:
        obj = self._objects[key]
        self._stamp(new, spec_changed=spec_changed)
        obj.create(new)  # a new version in the history
        await self._publish(key[0], "MODIFIED", obj.raw)

    async def _finish_deletion(self, key: Any) -> None:
        obj = self._objects[key]
        raw = copy.deepcopy(obj.raw)
        obj.delete()
        await self._publish(key[0], "DELETED", raw)
        uid = raw.get("metadata", {}).get("uid")
        if uid:
            await self._collect_garbage(uid)

    async def _collect_garbage(self, owner_uid: str) -> None:
        for key, obj in list(self._objects.items()):
            if obj.deleted:
                continue
            refs = obj.raw.get("metadata", {}).get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in refs):
                await self._delete(key)

    async def _delete(self, key: Any) -> None:
        obj = self._objects[key]
        meta = obj.raw.get("metadata", {})
        if meta.get("deletionTimestamp"):
            return
        if meta.get("finalizers"):
            new = copy.deepcopy(obj.raw)
            new["metadata"]["deletionTimestamp"] = _now()
            await self._modify(key, new, spec_changed=False)
        else:
            await self._finish_deletion(key)

    def _patched(
        self, resource: kmock.resource, current: dict[str, Any], request: rendering.Request
    ) -> dict[str, Any]:
        content_type = request.headers.get("Content-Type", "")
        data = request.data
        status_only = request.subresource == "status"
        has_status = self._has_subresource(resource, "status")
        if isinstance(data, list):  # JSON patch
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(current), data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise k8s.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
            if status_only:
                return {**current, "status": new.get("status")}
            if has_status:
                new.pop("status", None)
                if "status" in current:
                    new["status"] = current["status"]
            return dict(new)
        if not isinstance(data, dict):
            raise k8s.KubernetesError(status=400, reason="BadRequest", message="no patch body")
        data = copy.deepcopy(data)
        if status_only:
            data = {"status": data.get("status")}
        elif has_status:
            data.pop("status", None)
        if content_type.startswith(APPLY_CONTENT_TYPE) and not status_only:
            new = {k: v for k, v in current.items() if k in _KEEP_ON_APPLY}
            new.update({k: v for k, v in data.items() if k not in _KEEP_ON_APPLY})
            meta = copy.deepcopy(current.get("metadata", {}))
            for field in ("labels", "annotations"):
                if field in data.get("metadata", {}):
                    meta[field] = {**meta.get(field, {}), **data["metadata"][field]}
            if "ownerReferences" in data.get("metadata", {}):
                meta["ownerReferences"] = data["metadata"]["ownerReferences"]
            new["metadata"] = meta
            return new
        from kmock._internal import dicts

        return dict(dicts.merge_patch_dict(copy.deepcopy(current), data))

    def _scale_of(self, resource: kmock.resource, raw: dict[str, Any]) -> dict[str, Any]:
        paths = self.scales[resource]
        meta = raw["metadata"]
        status: dict[str, Any] = {"replicas": _get_path(raw, paths.status_replicas) or 0}
        if paths.label_selector:
            status["selector"] = _get_path(raw, paths.label_selector) or ""
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta
            },
            "spec": {"replicas": _get_path(raw, paths.spec_replicas) or 0},
            "status": status,
        }

    # --- the request pipeline -----------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None:
            return await kmock.KubernetesScaffold._handle(self, request)
        async with self._lock:
            key: Any = (resource, request.namespace, request.name)
            exists = key in self._objects and not self._objects[key].deleted
            if request.subresource == "scale" and resource in self.scales:
                if not exists:
                    raise k8s.KubernetesObjectNotFoundError()
                if request.action == enums.action.UPDATE:
                    replicas = (request.data or {}).get("spec", {}).get("replicas")
                    new = copy.deepcopy(self._objects[key].raw)
                    _set_path(new, self.scales[resource].spec_replicas, int(replicas))
                    await self._modify(key, new, spec_changed=True)
                return aiohttp.web.json_response(self._scale_of(resource, self._objects[key].raw))
            if request.action == enums.action.CREATE:
                key = await self._create(resource, request)
                return aiohttp.web.json_response(self._objects[key].raw, status=201)
            if request.action == enums.action.UPDATE and request.name is not None:
                content_type = request.headers.get("Content-Type", "")
                if not exists and content_type.startswith(APPLY_CONTENT_TYPE):
                    key = await self._create(resource, request)
                    return aiohttp.web.json_response(self._objects[key].raw, status=201)
                if not exists:
                    raise k8s.KubernetesObjectNotFoundError()
                current = copy.deepcopy(self._objects[key].raw)
                new = self._patched(resource, current, request)
                unchanged = {k: v for k, v in current.items() if k not in ("metadata", "status")}
                changed = {k: v for k, v in new.items() if k not in ("metadata", "status")}
                if new != current:
                    await self._modify(key, new, spec_changed=unchanged != changed)
                meta = self._objects[key].raw.get("metadata", {})
                if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                    raw = copy.deepcopy(self._objects[key].raw)
                    await self._finish_deletion(key)
                    return aiohttp.web.json_response(raw)
                return aiohttp.web.json_response(self._objects[key].raw)
            if request.action == enums.action.DELETE and request.name is not None:
                if not exists:
                    raise k8s.KubernetesObjectNotFoundError()
                raw = copy.deepcopy(self._objects[key].raw)
                await self._delete(key)
                return aiohttp.web.json_response(raw)
        return await kmock.KubernetesScaffold._handle(self, request)

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        async with self._lock:
            items = [copy.deepcopy(obj.raw) for obj in self._matching(request)]
        return {"metadata": {"resourceVersion": str(self._last_version)}, "items": items}

    def _matching(self, request: rendering.Request) -> list[Any]:
        return [
            obj
            for (res, ns, _), obj in self._objects.items()
            if res == request.resource
            and not obj.deleted
            and (request.namespace is None or ns == request.namespace)
        ]

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        """A watch from ``resourceVersion`` (replayed from history), else from a full listing.

        kmock's own watch re-sends every object as ADDED and subscribes only afterwards, which
        loses changes and repeats stale states that kopf then patches against (422 forever).
        """
        yield b""
        resource = request.resource
        assert resource is not None
        since = request.params.get("resourceVersion", "")
        bus = self._buses[resource]
        async with self._lock:
            marker = await bus.mark()
            if since.isdigit() and int(since) > 0:
                events = [
                    copy.deepcopy(event)
                    for version, res, event in self._history
                    if res == resource and version > int(since)
                ]
            else:
                events = [
                    {"type": "ADDED", "object": copy.deepcopy(obj.raw)}
                    for obj in self._matching(request)
                ]
        try:
            for event in events:
                if self._in_namespace(request, event):
                    yield event
            async for event in bus.stream(since=marker):
                if self._in_namespace(request, event):
                    yield event
        finally:
            await bus.unmark(marker)

    @staticmethod
    def _in_namespace(request: rendering.Request, event: dict[str, Any]) -> bool:
        namespace = event.get("object", {}).get("metadata", {}).get("namespace")
        return request.namespace is None or namespace == request.namespace

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        payload: Any = await super()._serve_version(request)
        if isinstance(payload, dict) and payload.get("groupVersion", "").startswith("/"):
            payload["groupVersion"] = payload["groupVersion"][1:]
        result: rendering.Payload = payload
        return result

    # --- test helpers -------------------------------------------------------------------

    @property
    def requests(self) -> list[rendering.Request]:
        """Every request served so far, in order."""
        return list(self._requests)

    def read(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    def names(self, resource: str, namespace: str) -> set[str]:
        wanted = kmock.resource(resource)
        return {
            name
            for (res, ns, name), obj in self._objects.items()
            if res == wanted and ns == namespace and not obj.deleted
        }

    async def set_status(self, resource: str, namespace: str, name: str, status: Any) -> None:
        """What a controller (kube-controller-manager) would do: write an object's status."""
        key = (kmock.resource(resource), namespace, name)
        async with self._lock:
            new = copy.deepcopy(self._objects[key].raw)
            new["status"] = status
            await self._modify(key, new, spec_changed=False)


RESOURCES: dict[str, kmock.ResourceInfo] = {
    # kopf waits for these two in discovery before it watches anything
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False
    ),
    "v1/pods": kmock.ResourceInfo(kind="Pod", namespaced=True),
    "v1/services": kmock.ResourceInfo(kind="Service", namespaced=True),
    "v1/configmaps": kmock.ResourceInfo(kind="ConfigMap", namespaced=True),
    "v1/secrets": kmock.ResourceInfo(kind="Secret", namespaced=True),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment", namespaced=True, subresources={"status", "scale"}
    ),
    "apps/v1/statefulsets": kmock.ResourceInfo(
        kind="StatefulSet", namespaced=True, subresources={"status", "scale"}
    ),
    "policy/v1/poddisruptionbudgets": kmock.ResourceInfo(
        kind="PodDisruptionBudget", namespaced=True, subresources={"status"}
    ),
    "autoscaling/v2/horizontalpodautoscalers": kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler", namespaced=True, subresources={"status"}
    ),
    "kafscale.io/v1alpha1/kafscaleclusters": kmock.ResourceInfo(
        kind="KafScaleCluster",
        singular="kafscalecluster",
        shortnames={"ksc"},
        namespaced=True,
        subresources={"status", "scale"},
    ),
    "kafscale.io/v1alpha1/kafscaletopics": kmock.ResourceInfo(
        kind="KafScaleTopic",
        singular="kafscaletopic",
        shortnames={"kst"},
        namespaced=True,
        subresources={"status"},
    ),
}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


@pytest_asyncio.fixture
async def kube_api() -> AsyncIterator[KubeEmulator]:
    emulator = KubeEmulator(
        scales={
            kmock.resource("kafscale.io/v1alpha1/kafscaleclusters"): ScalePaths(
                ".spec.brokers.replicas", ".status.brokers.replicas", ".status.brokers.selector"
            ),
            kmock.resource("apps/v1/deployments"): ScalePaths(
                ".spec.replicas", ".status.replicas", None
            ),
        }
    )
    for name, info in RESOURCES.items():
        info.verbs = set(VERBS)
        emulator.resources[name] = info
    async with emulator, kmock.Server(emulator):
        yield emulator


async def api_request(
    emulator: KubeEmulator,
    method: str,
    path: str,
    body: Any = None,
    content_type: str | None = None,
) -> tuple[int, Any]:
    """An HTTP call to the emulator, as kubectl would make it: (status, JSON body)."""
    headers = {"Content-Type": content_type or "application/json"}
    data = None if body is None else json.dumps(body)
    async with emulator.request(method, path, data=data, headers=headers) as response:
        text = await response.text()
        return response.status, (json.loads(text) if text else None)
