"""An emulated Kubernetes API for the operator client's unit tests (test_kube.py): kmock's emulator.

kmock 0.8 stores objects and streams watch events but leaves out what an API server adds: uid,
resourceVersion, metadata.generation, creationTimestamp, generateName, `kind` on lists and the core
group's `v1` groupVersion. `Emulator` adds those; `Cluster` runs it on 127.0.0.1 in a thread of its own
and gives the test a plain HTTP client. End-to-end claims are tested against a real API server
(tests/cluster), never against this.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import httpx
import jsonpatch
import kmock
import yaml
from kmock._internal import enums, parsing, rendering

_parse_path = parsing.parse_path


def _parse_namespaces(path: str) -> parsing.ParsedPath:
    """kmock 0.8 cannot parse the cluster-scoped namespaces resource (`/api/v1/namespaces[/NAME]`)."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _parse_path(path)


parsing.parse_path = _parse_namespaces  # rendering looks it up on the module at each request

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "datasetgenerations.eyrie.dev.yaml"

BUILTIN: dict[tuple[str, str, str], dict[str, Any]] = {
    ("", "v1", "configmaps"): {"kind": "ConfigMap", "namespaced": True},
    ("", "v1", "secrets"): {"kind": "Secret", "namespaced": True},
    ("", "v1", "events"): {"kind": "Event", "namespaced": True},
    ("", "v1", "namespaces"): {"kind": "Namespace", "namespaced": False},
    ("batch", "v1", "jobs"): {"kind": "Job", "namespaced": True, "subresources": ["status"]},
    ("ray.io", "v1", "rayjobs"): {"kind": "RayJob", "namespaced": True, "subresources": ["status"]},
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the object bookkeeping a real API server does."""

    _kinds: dict[Any, str] = attrs.field(factory=dict, init=False)
    _rv: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _inflight: set[int] = attrs.field(factory=set, init=False)

    def declare(self, group: str, version: str, plural: str, kind: str, namespaced: bool,
                subresources: list[str] | None = None, shortnames: list[str] | None = None) -> None:
        res = kmock.resource(group=group, version=version, plural=plural)
        self.resources[res] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, singular=kind.lower(),
                                                 verbs=VERBS, shortnames=shortnames or [],
                                                 subresources=subresources or [])
        self._kinds[res] = kind

    def install_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for v in spec["versions"]:
            self.declare(spec["group"], v["name"], names["plural"], names["kind"],
                         spec.get("scope", "Namespaced") == "Namespaced", list(v.get("subresources") or {}),
                         names.get("shortNames"))

    async def _render_error(self, exc: Exception) -> Any:
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):  # what a real API server answers
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)

    async def _handle(self, request: rendering.Request) -> Any:
        # kmock matches each request by scanning every request it ever served, so a long test or a
        # benchmark slows down quadratically; keep only the requests still being served.
        self._inflight.add(id(request))
        self._requests[:] = [r for r in self._requests if id(r) in self._inflight]
        try:
            return await self._serve(request)
        finally:
            self._inflight.discard(id(request))

    async def _serve(self, request: rendering.Request) -> Any:
        data = request.data
        if request.action == enums.action.UPDATE and isinstance(data, list):  # a JSON patch
            data.append({"op": "replace", "path": "/metadata/resourceVersion", "value": str(next(self._rv))})
        if request.resource is not None and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if request.action == enums.action.CREATE:
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta["generation"] = 1
                meta["resourceVersion"] = str(next(self._rv))
                if request.namespace and "namespace" not in meta:
                    meta["namespace"] = request.namespace
            elif request.action == enums.action.UPDATE:
                meta["resourceVersion"] = str(next(self._rv))
                if request.subresource is None and "spec" in data:
                    key = (request.resource, request.namespace, request.name)
                    if key in self.objects and not self.objects[key].deleted:
                        meta["generation"] = int(self.objects[key].get("metadata", {}).get("generation", 1)) + 1
        return await super()._handle(request)

    async def _serve_list(self, request: rendering.Request) -> Any:
        result = await super()._serve_list(request)
        assert request.resource is not None
        kind = self._kinds.get(request.resource, "")
        gv = "/".join(p for p in (request.resource.group, request.resource.version) if p)
        return {"kind": f"{kind}List", "apiVersion": gv, **result}

    async def _serve_version(self, request: rendering.Request) -> Any:
        result = await super()._serve_version(request)
        result["groupVersion"] = result["groupVersion"].lstrip("/")
        for res in result["resources"]:
            if "/" in res["name"]:  # subresources: no short names or categories of their own
                res.update(shortNames=[], categories=[], verbs=["get", "patch", "update"])
        return result

def path(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None,
         sub: str | None = None) -> str:
    base = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


DSG = ("eyrie.dev", "v1alpha1", "datasetgenerations")
RAYJOBS = ("ray.io", "v1", "rayjobs")
JOBS = ("batch", "v1", "jobs")
CONFIGMAPS = ("", "v1", "configmaps")
SECRETS = ("", "v1", "secrets")


class Cluster:
    """The emulator on 127.0.0.1 in its own thread and event loop; `api` is a sync HTTP client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kmock")
        self.emulator: Emulator | None = None
        self._server: kmock.Server | None = None
        self.url = ""
        self.api: httpx.Client | None = None

    def start(self) -> Cluster:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        self.api = httpx.Client(base_url=self.url, timeout=10)
        return self

    async def _start(self) -> None:
        self.emulator = Emulator()
        await self.emulator.__aenter__()
        for (g, v, p), info in BUILTIN.items():
            self.emulator.declare(g, v, p, info["kind"], info["namespaced"], info.get("subresources"))
        self.emulator.install_crd(yaml.safe_load(CRD_PATH.read_text()))
        self._server = kmock.Server(self.emulator)
        await self._server.__aenter__()
        self.url = str(self._server.url).rstrip("/")

    def stop(self) -> None:
        if self.api is not None:
            self.api.close()

        async def _stop() -> None:
            assert self._server is not None and self.emulator is not None
            await self._server.__aexit__(None, None, None)
            await self.emulator.__aexit__(None, None, None)

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def kubeconfig(self, where: Path) -> Path:
        where.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test",
                                                        "namespace": "default"}}],
        }))
        return where

    # --- plain REST, as kubectl or a controller would do it

    def get(self, res: tuple[str, str, str], ns: str, name: str) -> dict[str, Any] | None:
        assert self.api is not None
        r = self.api.get(path(*res, ns, name))
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def list(self, res: tuple[str, str, str], ns: str) -> list[dict[str, Any]]:
        assert self.api is not None
        r = self.api.get(path(*res, ns))
        r.raise_for_status()
        return r.json()["items"]

    def create(self, res: tuple[str, str, str], ns: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self.api is not None
        r = self.api.post(path(*res, ns), json=body)
        r.raise_for_status()
        return r.json()

    def patch(self, res: tuple[str, str, str], ns: str, name: str, body: dict[str, Any],
              sub: str | None = None) -> dict[str, Any]:
        assert self.api is not None
        r = self.api.patch(path(*res, ns, name, sub), json=body,
                           headers={"Content-Type": "application/merge-patch+json"})
        r.raise_for_status()
        return r.json()

    def delete(self, res: tuple[str, str, str], ns: str, name: str) -> None:
        assert self.api is not None
        r = self.api.delete(path(*res, ns, name))
        if r.status_code != 404:
            r.raise_for_status()

    def secret(self, ns: str, name: str, data: dict[str, str]) -> None:
        self.create(SECRETS, ns, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                                  "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})

@contextmanager
def running_cluster() -> Iterator[Cluster]:
    cluster = Cluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()
