"""The operator's reads and writes of Kubernetes objects, through `kubernetes_asyncio`.

Why kubernetes_asyncio: it is the client generated from Kubernetes' own OpenAPI spec (released in
step with Kubernetes minors), it is asyncio-native, so calls run on kopf's event loop instead of
threads, and it is what the model operator in STYLE.md (crate-operator) uses. kr8s and lightkube
would do too, but bring a second HTTP stack (httpx) and their own object models beside kopf's
aiohttp; kopf's own API client is private (`kopf._cogs`). Only the public API classes are used:
`CoreV1Api` and `BatchV1Api` for built-in kinds, `CustomObjectsApi` for DatasetGeneration and RayJob.

Every read returns the object as the API's JSON (a dict): the pure reconcile reads a few fields of
each child and must not depend on which fields a client version's typed models know.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from eyrie.jobs.errors import EyrieError
from eyrie.jobs.spec import GROUP, PLURAL, VERSION

from .children import RAYJOB_API

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT = 30  # seconds per request: a hung API server must not hold a resource's lock forever


class Kind(Enum):
    """The kinds the operator touches (`rbac.RULES` lists what it may do with each)."""

    CONFIGMAP = "configmaps"
    SECRET = "secrets"
    POD = "pods"
    JOB = "jobs"
    RAYJOB = "rayjobs"
    DATASET = "datasetgenerations"


class KubeError(EyrieError, RuntimeError):
    """An API request failed; the message names the request and the server's answer."""

    def __init__(self, verb: str, kind: Kind, name: str, status: int, detail: str):
        self.status, self.detail = status, detail
        super().__init__(f"{verb} {kind.value}/{name}: {status} {detail}")

    @property
    def rejected(self) -> bool:
        """The server (schema, CEL, admission webhook) refused the object itself: retrying the same
        body gets the same answer, so the run fails instead of looping."""
        return self.status in (400, 422) or (self.status == 403 and "admission webhook" in self.detail)


def _detail(e: ApiException) -> str:
    """The `message` of the Status the API server answers with, else the HTTP reason."""
    try:
        return str(orjson.loads(e.body or b"{}").get("message") or e.reason)
    except (orjson.JSONDecodeError, AttributeError):
        return str(e.reason)


@dataclass(frozen=True)
class _Ops:
    """One kind's calls, all with the typed APIs' argument order: (name, namespace[, body])."""

    read: Callable[..., Awaitable[Any]]
    create: Callable[..., Awaitable[Any]] | None = None
    patch: Callable[..., Awaitable[Any]] | None = None
    delete: Callable[..., Awaitable[Any]] | None = None
    patch_status: Callable[..., Awaitable[Any]] | None = None


def _custom(api: client.CustomObjectsApi, group: str, version: str, plural: str) -> _Ops:
    return _Ops(
        read=lambda name, ns, **kw: api.get_namespaced_custom_object(group, version, ns, plural, name, **kw),
        create=lambda ns, body, **kw: api.create_namespaced_custom_object(group, version, ns, plural, body, **kw),
        patch=lambda name, ns, body, **kw: api.patch_namespaced_custom_object(
            group, version, ns, plural, name, body, **kw),
        delete=lambda name, ns, **kw: api.delete_namespaced_custom_object(group, version, ns, plural, name, **kw),
        patch_status=lambda name, ns, body, **kw: api.patch_namespaced_custom_object_status(
            group, version, ns, plural, name, body, **kw))


class Kube:
    """get / create / patch / delete by `Kind`; 404 on get is None, 409 on create is False."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        self._core = core
        self._ops = {
            Kind.CONFIGMAP: _Ops(core.read_namespaced_config_map, core.create_namespaced_config_map,
                                 core.patch_namespaced_config_map),
            Kind.SECRET: _Ops(core.read_namespaced_secret),
            Kind.JOB: _Ops(batch.read_namespaced_job, batch.create_namespaced_job, batch.patch_namespaced_job,
                           batch.delete_namespaced_job),
            Kind.RAYJOB: _custom(client.CustomObjectsApi(api), *RAYJOB_API),
            Kind.DATASET: _custom(client.CustomObjectsApi(api), GROUP, VERSION, PLURAL),
        }

    @classmethod
    async def connect(cls) -> Kube:
        """In a pod: the service account; elsewhere: the kubeconfig (KUBECONFIG or ~/.kube/config)."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            await config.load_kube_config()
        return cls(client.ApiClient())

    async def close(self) -> None:
        await self.api.close()

    def _json(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(await self._ops[kind].read(name, namespace, _request_timeout=TIMEOUT))
        except ApiException as e:
            if e.status == 404:
                return None
            raise KubeError("get", kind, name, e.status, _detail(e)) from None

    async def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods a label selector picks (a child's: the why of a pod that does not run is on the pod)."""
        try:
            found = await self._core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=TIMEOUT)
            return list(self._json(found).get("items") or [])
        except ApiException as e:
            raise KubeError("list", Kind.POD, selector, e.status, _detail(e)) from None

    async def create(self, kind: Kind, namespace: str, body: dict[str, Any]) -> bool:
        """Create; False when it already exists (a restarted operator meets its own children)."""
        op = self._ops[kind].create
        assert op is not None, f"the operator never creates {kind.value}"
        try:
            await op(namespace, body, _request_timeout=TIMEOUT)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise KubeError("create", kind, body["metadata"]["name"], e.status, _detail(e)) from None

    async def patch(self, kind: Kind, namespace: str, name: str, body: dict[str, Any],
                    status: bool = False) -> None:
        """A JSON merge patch (RFC 7386) of the object, or of its status subresource."""
        op = self._ops[kind].patch_status if status else self._ops[kind].patch
        assert op is not None, f"the operator never patches {kind.value}"
        try:
            await op(name, namespace, body, _content_type=MERGE_PATCH, _request_timeout=TIMEOUT)
        except ApiException as e:
            raise KubeError("patch", kind, name, e.status, _detail(e)) from None

    async def delete(self, kind: Kind, namespace: str, name: str) -> None:
        """Delete in the background (the garbage collector removes what it owns); gone already is fine."""
        op = self._ops[kind].delete
        assert op is not None, f"the operator never deletes {kind.value}"
        try:
            await op(name, namespace, propagation_policy="Background", _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status != 404:
                raise KubeError("delete", kind, name, e.status, _detail(e)) from None
