"""A real node for the testbed (DESIGN §9, issue 28): containerd + runc, the kubelet, kube-proxy and CoreDNS in a
network namespace of their own, joined to the host by a veth pair, and kube-scheduler beside the control plane.

Every address is on loopback or inside the namespaces created here, never the VM's own interface address: the
node's end of the veth is its InternalIP (the API server reaches the kubelet there for logs and exec), the host's
end is where the node and its pods reach the control plane, whose ports the host forwards to its loopback (DNAT,
`route_localnet` on the veth only); pods get addresses on a bridge inside the node's namespace and leave it
masqueraded as the node. Nothing routes through the host: it forwards nothing (ip_forward stays as it is) and the
node's namespace has no default route.

containerd and the kubelet share a mount namespace of their own (slave to the host's), so every mount they make
(image snapshots, volumes, pod network namespaces) is gone with them; in it the three kernel settings the kubelet
would otherwise change for the whole machine (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) read as
the values it wants. Pods run in cgroups under a root of their own. Every process is started and stopped here by
its PID; the containers, cgroups, veth, namespaces, forwarding rules and files are removed at stop.

Seen needed on these machines (DESIGN §9): containerd's CRI `restrict_oom_score_adj` (root lacks
CAP_SYS_RESOURCE), runc (crun refuses the hybrid cgroup layout), kubelet `failCgroupV1: false` with the cgroupfs
driver, a sandbox image built here (no registry is reachable) and images imported, never pulled.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from .testbed import (
    CLUSTER_DOMAIN,
    PODS,
    SERVICE_CIDR,
    ControlPlane,
    Process,
    TestbedMissing,
    _ok,
    binary,
    cache_dir,
    free_port,
    kuberay_crds,
    load_yaml,
    node_link,
    running_control_plane,
    spawn,
    versions,
    wait_for,
)

HERE = Path(__file__).resolve().parent
NODE_NAME = "eyrie-node"
DNS_SERVICE_IP = "10.96.0.10"
CNI_BIN = Path("/usr/lib/cni")
DEPS = "hack/test-deps.sh"
NODES: tuple[str, str, str] = ("", "v1", "nodes")
SERVICES: tuple[str, str, str] = ("", "v1", "services")
ENDPOINTSLICES: tuple[str, str, str] = ("discovery.k8s.io", "v1", "endpointslices")
CLUSTERROLES = ("rbac.authorization.k8s.io", "v1", "clusterroles")
CLUSTERROLEBINDINGS = ("rbac.authorization.k8s.io", "v1", "clusterrolebindings")
# what the kubelet sets machine-wide unless it reads these values already (pkg/kubelet/cm: setupKernelTunables)
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
HOST_TOOLS = ("ip", "iptables", "nsenter", "unshare", "mount", "containerd", "containerd-shim-runc-v2", "ctr", "runc")


def run(*argv: str | Path, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def require_host() -> None:
    """What the node needs from the machine: root, Debian's containerd, runc, CNI plugins, iproute2 and iptables."""
    if os.geteuid() != 0:
        raise TestbedMissing("the node needs root (network namespaces, mounts, cgroups)")
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    missing += [f"{CNI_BIN}/{p}" for p in ("bridge", "host-local", "loopback", "portmap")
                if not (CNI_BIN / p).exists()]
    if missing:
        raise TestbedMissing(f"the node needs {', '.join(missing)}: run `{DEPS}` (installs Debian's containerd, "
                             "runc, containernetworking-plugins and iptables once per machine)")


def node_binary(name: str) -> Path:
    """kubelet, kube-proxy, kube-scheduler: built from the control plane's k8s.io/kubernetes by build.sh."""
    return binary("kubernetes-node", name, version_key="KUBERNETES")


# --- OCI image archives (what `ctr images import` reads), for the images the node itself needs

@dataclass(frozen=True)
class Entry:
    """One path in an image layer: a file (data), a directory (data None) or a symlink (link)."""

    path: str
    data: bytes | None = None
    mode: int = 0o755
    link: str | None = None


def oci_archive(dest: Path, ref: str, entries: Iterable[Entry], config: dict[str, Any]) -> Path:
    """An OCI image layout in a tar (one uncompressed layer), its image named `ref` as buildah names it, so that
    `ctr images import` stores it under that name. Deterministic: the same entries give the same digests."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.path.lstrip("/"))
            info.mtime, info.mode = 0, e.mode
            if e.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(info)
            elif e.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": digest, "size": len(data)}

    layer_desc = blob(layer.getvalue(), "application/vnd.oci.image.layer.v1.tar")
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]}}
    config_desc = blob(json.dumps(image_config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": [layer_desc]}
    manifest_desc = blob(json.dumps(manifest, sort_keys=True).encode(), manifest["mediaType"])
    index = {"schemaVersion": 2, "manifests": [{
        **manifest_desc, "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref}}]}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".partial")
    with tarfile.open(tmp, mode="w") as tar:
        files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
                 "index.json": json.dumps(index, sort_keys=True).encode(),
                 **{f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()}}
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    tmp.rename(dest)
    return dest


def _cached_image(name: str, sources: list[Path], build: Any) -> tuple[str, Path]:
    """An archive in the testbed cache keyed by what goes into it; `build(dest, ref)` writes it when missing."""
    digest = hashlib.sha256(b"".join(hashlib.sha256(p.read_bytes()).digest() for p in sources)).hexdigest()[:12]
    ref = f"localhost/eyrie-testbed/{name}:{digest}"
    dest = cache_dir() / "images" / f"testbed-{name}-{digest}.oci.tar"
    if not dest.exists():
        build(dest, ref)
    return ref, dest


def archive_image(archive: Path) -> tuple[str, str]:
    """The name and manifest digest of the one image in an OCI archive (its index.json; an uncompressed tar, so only
    the headers are read on the way)."""
    with tarfile.open(archive) as tar:
        f = tar.extractfile("index.json")
        assert f is not None, f"{archive} has no index.json: not an OCI archive"
        [manifest] = json.load(f)["manifests"]
    ann = manifest.get("annotations") or {}
    return ann.get("io.containerd.image.name") or ann["org.opencontainers.image.ref.name"], manifest["digest"]


def sandbox_image() -> tuple[str, Path]:
    """The sandbox ("pause") image containerd's sandbox_image names: Kubernetes' own pause, which hack/images.sh
    compiles at the pinned version (no registry is reachable)."""
    found = sorted((cache_dir() / "images").glob("pause-*.oci.tar"))
    if not found:
        raise TestbedMissing(f"no pause image under {cache_dir() / 'images'}: build it with `hack/images.sh pause` "
                             "(once per machine; hack/test-deps.sh runs it)")
    return archive_image(found[-1])[0], found[-1]


def busybox_image() -> tuple[str, Path]:
    """A small image with a shell and network tools for the node's own tests: Debian's static busybox
    (`busybox-static`), one symlink per applet."""
    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        raise TestbedMissing(f"{busybox} is missing: run `{DEPS}` (installs Debian's busybox-static)")

    def build(dest: Path, ref: str) -> None:
        applets = sorted(set(run(busybox, "--list").stdout.split()) - {"busybox"})
        entries = [Entry("/bin", None), Entry("/tmp", None, 0o1777), Entry("/etc", None),
                   Entry("/bin/busybox", busybox.read_bytes()),
                   Entry("/etc/passwd", b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n", 0o644),
                   Entry("/etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644),
                   *(Entry(f"/bin/{a}", link="busybox") for a in applets)]
        oci_archive(dest, ref, entries, {"Cmd": ["sh"], "Env": ["PATH=/bin"]})
    return _cached_image("busybox", [busybox], build)


def kuberay_image() -> tuple[str, Path]:
    """The KubeRay operator image, as KubeRay's own manager.yaml names it (config/default's kustomization), made of
    the ray-operator binary build.sh built: static, run as a non-root user."""
    manager = binary("kuberay", "ray-operator")
    version = versions()["KUBERAY"]
    ref = f"quay.io/kuberay/operator:{version}"
    digest = hashlib.sha256(manager.read_bytes()).hexdigest()[:12]
    dest = cache_dir() / "images" / f"testbed-kuberay-{version}-{digest}.oci.tar"
    if not dest.exists():
        oci_archive(dest, ref, [Entry("/manager", manager.read_bytes())],
                    {"Entrypoint": ["/manager"], "User": "65532:65532"})
    return ref, dest


KUBERAY_NS = "kuberay-system"


def install_kuberay(node: Node) -> None:
    """KubeRay as its release deploys it, on the node: its CRDs, ServiceAccount, ClusterRole and bindings
    (config/rbac) and its Deployment (config/manager), read from the Go module cache, in KUBERAY_NS. In the
    cluster, because KubeRay's RayJob controller reads each job's state from the head's dashboard at its
    Service's cluster DNS name."""
    cp = node.cp
    cp.apply_crds(*kuberay_crds())
    ref, archive = kuberay_image()
    node.import_image(archive)
    config = kuberay_crds()[0].parents[2]
    docs = [load_yaml((config / "rbac" / f).read_text()) for f in (
        "service_account.yaml", "role.yaml", "role_binding.yaml", "leader_election_role.yaml",
        "leader_election_role_binding.yaml")]
    docs.append(load_yaml((config / "manager" / "manager.yaml").read_text()))
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["namespace"] = KUBERAY_NS
        for subject in doc.get("subjects") or []:
            subject["namespace"] = KUBERAY_NS
        if doc["kind"] == "Deployment":
            doc["spec"]["template"]["spec"]["containers"][0]["image"] = ref
    cp.ensure_namespace(KUBERAY_NS)
    manifest = node.root / "kuberay.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    cp.kubectl("apply", "-f", str(manifest), check=True)
    cp.kubectl("rollout", "status", "-n", KUBERAY_NS, "deployment/kuberay-operator", "--timeout=180s", check=True)


def images_archive(name: str) -> Path:
    """An image `hack/images.sh` built from its Dockerfile under images/ (operator, ray-worker, extractor-cpu), in
    the testbed cache as NAME-VERSION.oci.tar, named inside as the chart and the specs name it."""
    version = tomllib.loads((HERE.parents[1] / "pyproject.toml").read_text())["project"]["version"]
    path = cache_dir() / "images" / f"{name}-{version}.oci.tar"
    if not path.is_file():
        raise TestbedMissing(f"{path} is missing: build it with `hack/images.sh {name}` (once per machine; "
                             "hack/test-deps.sh runs it)")
    return path


# --- the network: a namespace for the node, a veth to the host, the host's forwarding of its loopback ports

@dataclass
class Link:
    """The node's network namespace and its veth pair to the host, named after the API server's port (unique
    among testbeds alive on the machine), and the host's DNAT of the loopback ports the node may reach."""

    api_port: int
    exposed: set[int] = field(default_factory=set)
    created: bool = False

    @property
    def host_ip(self) -> str:
        return node_link(self.api_port)[0]

    @property
    def node_ip(self) -> str:
        return node_link(self.api_port)[1]

    @property
    def pod_cidr(self) -> str:
        """The node's pods' addresses: a /26 of 100.64.0.0/10 (shared address space) of its own, so the host can
        route it to the node without meeting another testbed's."""
        return f"{ipaddress.IPv4Address(int(ipaddress.IPv4Address('100.64.0.0')) + 64 * self.api_port)}/26"

    @property
    def netns(self) -> str:
        return f"eyrie-node-{self.api_port}"

    @property
    def host_if(self) -> str:
        return f"eyh{self.api_port}"

    @property
    def node_if(self) -> str:
        return f"eyn{self.api_port}"

    @property
    def chain(self) -> str:
        return f"EYRIE-NODE-{self.api_port}"

    def in_netns(self, *argv: str | Path) -> list[str]:
        """argv run in the node's network namespace (nsenter execs it: the PID stays the command's)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *map(str, argv)]

    def create(self) -> Link:
        if Path(f"/run/netns/{self.netns}").exists():
            raise RuntimeError(f"network namespace {self.netns} exists: a testbed on port {self.api_port} was not "
                               f"stopped; remove it with `ip netns delete {self.netns}` once nothing runs in it")
        vm_if = run("ip", "-o", "route", "get", "1").stdout.split(" dev ")[1].split()[0]
        ours = (ipaddress.ip_network(f"{self.host_ip}/30", strict=False), ipaddress.ip_network(self.pod_cidr))
        for line in run("ip", "-o", "-4", "addr").stdout.splitlines():
            if any(ipaddress.ip_interface(line.split()[3]).network.overlaps(net) for net in ours):
                raise RuntimeError(f"the node's networks {ours} overlap an address of this machine: {line}")
        self.created = True
        run("ip", "netns", "add", self.netns)
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.node_if, "netns", self.netns)
        run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        ns = ("ip", "-n", self.netns)
        run(*ns, "link", "set", "lo", "up")
        run(*ns, "addr", "add", f"{self.node_ip}/30", "dev", self.node_if)
        run(*ns, "link", "set", self.node_if, "up")
        # the host end of the veth, for the Service range too (a ClusterIP without endpoints is rejected by
        # kube-proxy before it is routed); no default route: nothing leaves through the host
        run(*ns, "route", "add", SERVICE_CIDR, "via", self.host_ip)
        for key in ("net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"):
            run(*self.in_netns("sysctl", "-q", "-w", key))
        # the host: its loopback ports the node may reach, at the veth's host end, and only from the veth
        run("sysctl", "-q", "-w", f"net.ipv4.conf.{self.host_if}.route_localnet=1")
        run("iptables", "-t", "nat", "-N", self.chain)
        run("iptables", "-t", "nat", "-A", "PREROUTING", "-i", self.host_if, "-j", self.chain)
        # the pods, through the node (the API server's proxy to a pod or Service dials their addresses)
        run("ip", "route", "add", self.pod_cidr, "via", self.node_ip, "dev", self.host_if)
        for address in (self.node_ip, self.pod_cidr.split("/")[0]):
            route = run("ip", "-o", "route", "get", address).stdout
            assert f"dev {self.host_if}" in route and f"dev {vm_if}" not in route, route
        return self

    def expose(self, port: int) -> None:
        """The host's 127.0.0.1:port, reachable from the node and its pods at host_ip:port."""
        if port not in self.exposed:
            run("iptables", "-t", "nat", "-A", self.chain, "-d", self.host_ip, "-p", "tcp", "--dport", str(port),
                "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}")
            self.exposed.add(port)

    def delete(self) -> None:
        if not self.created:
            return
        run("iptables", "-t", "nat", "-D", "PREROUTING", "-i", self.host_if, "-j", self.chain, check=False)
        run("iptables", "-t", "nat", "-F", self.chain, check=False)
        run("iptables", "-t", "nat", "-X", self.chain, check=False)
        run("ip", "link", "delete", self.host_if, check=False)  # its peer goes with it
        run("ip", "netns", "delete", self.netns, check=False)
        self.created = False


# --- the node

@dataclass
class Node:
    """One node of the control plane `cp` (started with `node=NODE_NAME`), its files under `root`."""

    cp: ControlPlane
    root: Path
    link: Link = field(init=False)
    procs: list[Process] = field(default_factory=list)
    images: dict[str, Path] = field(default_factory=dict)
    cgroup_root: str = field(init=False)
    started_in: float = 0.0
    store: Path | None = None  # containerd's root: images and their snapshots
    store_lock: Any = None
    _kubelet_argv: list[str | Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.cp.node == NODE_NAME, "start the control plane with node=NODE_NAME"
        self.link = Link(self.cp.api_port)
        self.cgroup_root = f"eyrie-node-{self.cp.api_port}"

    @property
    def ip(self) -> str:
        return self.link.node_ip

    @property
    def sock(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def server(self) -> str:
        """The API server as the node and its pods reach it."""
        return f"https://{self.link.host_ip}:{self.cp.api_port}"

    def kubeconfig(self, component: str, inside: bool = True) -> Path:
        """The component's kubeconfig: from inside the node's namespace through the veth, or from the host's."""
        return self.cp.kubeconfig(self.root / f"{component}.kubeconfig", self.cp.tokens[component],
                                  server=self.server if inside else None)

    # --- start

    def start(self, images: Iterable[Path] = ()) -> Node:
        require_host()
        kubelet, proxy, scheduler = (node_binary(n) for n in ("kubelet", "kube-proxy", "kube-scheduler"))
        coredns = binary("coredns", "coredns")
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        reap_stale_nodes()
        self._record()
        self.link.create()
        self.link.expose(self.cp.api_port)
        self._cgroups_create()
        sandbox_ref, sandbox = sandbox_image()
        self._start_containerd(sandbox_ref)
        for archive in (sandbox, *images):
            self.import_image(archive)
        self._start_kubelet(kubelet)
        wait_for(f"node {NODE_NAME} Ready", self._ready, timeout=90, every=0.25)
        self._cluster_dns()
        self._spawn("kube-proxy", self.link.in_netns(proxy, f"--config={self._proxy_config()}"),
                                self.root / "kube-proxy.log")
        self._spawn("coredns", self.link.in_netns(coredns, "-conf", self._corefile()),
                                self.root / "coredns.log")
        self._start_scheduler(scheduler)
        with httpx.Client(timeout=2) as c:
            wait_for("kube-proxy /healthz", lambda: self._check() or _ok(c, f"http://{self.ip}:{self._ports['proxy']}"
                                                                            "/healthz"), timeout=60, every=0.25)
            wait_for("CoreDNS /ready", lambda: self._check() or _ok(c, f"http://{self.ip}:{self._ports['dns_ready']}"
                                                                       "/ready"), timeout=60, every=0.25)
        with httpx.Client(timeout=2, verify=False) as c:  # its self-signed serving certificate
            wait_for("kube-scheduler /healthz", lambda: self._check() or _ok(
                c, f"https://127.0.0.1:{self._ports['scheduler']}/healthz"), timeout=60, every=0.25)
        self.started_in = time.monotonic() - t0
        return self

    @property
    def record(self) -> Path:
        return RECORDS / f"node-{self.cp.api_port}.json"

    def _record(self) -> None:
        """What reap_stale_nodes needs to remove this node should its test process die without stopping it."""
        RECORDS.mkdir(parents=True, exist_ok=True)
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "owner": [os.getpid(), _start_time(os.getpid())], "api_port": self.cp.api_port, "root": str(self.root),
            "cgroup_root": self.cgroup_root, "sock": str(self.sock), "control_plane": str(self.cp.root),
            "pids": [[p.proc.pid, _start_time(p.proc.pid)] for p in (*self.cp.procs, *self.procs)]}))
        tmp.rename(self.record)

    def _spawn(self, name: str, argv: list[str | Path], log: Path) -> None:
        self.procs.append(spawn(name, argv, log))
        self._record()

    def _check(self) -> None:
        for p in self.procs:
            p.check()

    def _cgroups_create(self) -> None:
        """The cgroup root of the node's pods in each cgroup v1 hierarchy (the kubelet wants it to exist)."""
        for hierarchy in _cgroup_hierarchies():
            d = hierarchy / self.cgroup_root
            d.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset is empty: no task could join it
                if (d / f).exists() and not (d / f).read_text().strip():
                    (d / f).write_text((hierarchy / f).read_text())

    def _open_store(self) -> None:
        """containerd's root (content, image snapshots, metadata): kept in the testbed cache between runs, so that
        an image already imported from the same archive costs nothing (a Ray image is GBs: minutes to unpack), while
        one node at a time holds it; a node started meanwhile gets a fresh root of its own and imports into it."""
        shared = cache_dir() / "node-containerd"
        shared.mkdir(parents=True, exist_ok=True)
        lock = (cache_dir() / "node-containerd.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            self.store = self.root / "containerd" / "root"
            return
        self.store, self.store_lock = shared, lock

    def _start_containerd(self, sandbox_ref: str) -> None:
        d = self.root / "containerd"
        (d / "cni").mkdir(parents=True, exist_ok=True)
        self._open_store()
        (d / "cni" / "10-eyrie.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": self.link.netns, "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": self.link.pod_cidr}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(d / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{self.store}"
state = "{d / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[{cri}]
  sandbox_image = "{sandbox_ref}"
  # root here lacks CAP_SYS_RESOURCE: the -998 the kubelet asks for each sandbox would be refused
  restrict_oom_score_adj = true
  # the pods' network namespaces pinned under the state dir, not the host's /run/netns
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{shutil.which('runc')}"
        Root = "{d / 'runc'}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d / 'cni'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'opt'}"
"""
        (d / "config.toml").write_text(config)
        fakes = []
        for key, want in KUBELET_SYSCTLS.items():
            if Path(f"/proc/sys/{key}").read_text().strip() != want:
                fake = d / f"sysctl-{key.replace('/', '.')}"
                fake.write_text(want + "\n")
                fakes.append(f"mount --bind {fake} /proc/sys/{key} && ")
        # a mount namespace of its own (the kubelet joins it): enters the node's network namespace, shows the kubelet
        # its kernel settings, then becomes containerd
        script = "".join(fakes) + f'exec containerd --config "{d / "config.toml"}"'
        self._spawn("containerd", self.link.in_netns(
            "unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script), self.root / "containerd.log")
        wait_for("containerd's socket", lambda: self.procs[-1].check() or (
            self.sock.exists() and self.ctr("version", check=False).returncode == 0), timeout=60, every=0.2)
        self._remove_containers()  # a node killed before its stop left them in the kept root

    def _remove_containers(self) -> list[str]:
        """Kill and delete every container of this containerd; returns their ids."""
        cids = self.containers()
        for task in self.ctr("tasks", "list", "--quiet", check=False).stdout.split():
            self.ctr("tasks", "kill", "--signal=SIGKILL", task, check=False)
        for cid in cids:
            self.ctr("tasks", "delete", "--force", cid, check=False)
            self.ctr("containers", "delete", cid, check=False)
        return cids

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run("ctr", f"--address={self.sock}", "--namespace=k8s.io", *args, check=check, timeout=timeout)

    def import_image(self, archive: Path) -> str:
        """Import an OCI archive into containerd's k8s.io namespace (where the kubelet finds it; nothing is pulled)
        unless the image is there already from the same archive (same name, same manifest), and return its name."""
        name, digest = archive_image(archive)
        listed = self.ctr("images", "list").stdout.split("\n")
        if not any(line.split()[:1] == [name] and digest in line for line in listed):
            self.ctr("images", "import", "--snapshotter=overlayfs", str(archive))
        self.images[name] = archive
        return name

    def _start_kubelet(self, kubelet: Path) -> None:
        d = self.root / "kubelet"
        d.mkdir(exist_ok=True)
        self._ports = {"kubelet_healthz": free_port(), "proxy": free_port(), "proxy_metrics": free_port(),
                       "dns_health": free_port(), "dns_ready": free_port(), "scheduler": free_port()}
        config = d / "config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": self.ip, "healthzPort": self._ports["kubelet_healthz"],
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_root}", "failCgroupV1": False,
            "failSwapOn": False, "oomScoreAdj": 0,  # lowering it needs CAP_SYS_RESOURCE
            "clusterDNS": [DNS_SERVICE_IP], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": "",
            "podLogsDir": str(self.root / "pod-logs"),
            # nothing is pulled, so nothing may be collected; a busy shared disk must not evict the tests' pods
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False, "registerNode": True, "rotateCertificates": False,
            "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
        }))
        self._kubelet_argv = [
            kubelet, f"--config={config}", f"--kubeconfig={self.kubeconfig('kubelet')}", f"--root-dir={d / 'root'}",
            f"--cert-dir={d / 'pki'}", f"--hostname-override={NODE_NAME}", f"--node-ip={self.ip}", "--v=1"]
        self._spawn("kubelet", self._in_node_mounts("containerd", self._kubelet_argv), self.root / "kubelet.log")

    def _in_node_mounts(self, beside: str, argv: list[str | Path]) -> list[str | Path]:
        """argv run in the node's network namespace and in the mount namespace of its process `beside` (containerd's,
        made as it started: the kubelet's volumes, the images' snapshots and the pods' network namespaces are mounts
        there, so whatever joins the node later joins that one)."""
        pid = self._process(beside).proc.pid
        return ["nsenter", f"--mount=/proc/{pid}/ns/mnt", f"--net=/run/netns/{self.link.netns}", "--", *argv]

    def _process(self, name: str) -> Process:
        return next(p for p in self.procs if p.name == name)

    # --- faults: a node's own processes restarted under its pods, as `systemctl restart` would

    def restart_kubelet(self) -> float:
        """SIGTERM the kubelet, start it again with the same configuration; returns the seconds it was away. The
        containers keep running (they are containerd's); the kubelet finds them again."""
        return self._restart("kubelet", lambda: self._in_node_mounts("containerd", self._kubelet_argv))

    def restart_containerd(self) -> float:
        """SIGTERM containerd, start it again with the same configuration in the same mount namespace (the
        kubelet's: the running containers' snapshots and sandboxes are mounted there); returns the seconds it was
        away. Its shims, and so the containers, keep running; containerd reconnects to them as it starts."""
        config = self.root / "containerd" / "config.toml"
        return self._restart("containerd", lambda: self._in_node_mounts("kubelet", ["containerd", "--config",
                                                                                     config]))

    def _restart(self, name: str, argv: Any) -> float:
        i = next(i for i, p in enumerate(self.procs) if p.name == name)
        old = self.procs[i]
        t0 = time.monotonic()
        old.stop(grace=30)
        self.procs[i] = spawn(name, argv(), old.log)
        self._record()
        if name == "containerd":
            wait_for("containerd's socket again", lambda: self.procs[i].check() or self.ctr(
                "version", check=False).returncode == 0, timeout=60, every=0.2)
        else:
            with httpx.Client(timeout=2) as c:
                wait_for("the kubelet's /healthz again", lambda: self.procs[i].check() or _ok(
                    c, f"http://{self.ip}:{self._ports['kubelet_healthz']}/healthz"), timeout=60, every=0.2)
        return time.monotonic() - t0

    def _ready(self) -> bool:
        self._check()
        node = self.cp.get(NODES, "", NODE_NAME)
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in ((node or {}).get("status") or {}).get("conditions") or [])

    def _cluster_dns(self) -> None:
        """CoreDNS's RBAC and the kube-dns Service at DNS_SERVICE_IP (what the kubelet writes into pods'
        resolv.conf), whose endpoint is CoreDNS on the node's address."""
        self.cp.create(CLUSTERROLES, "", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                          "metadata": {"name": "system:coredns"}, "rules": [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
             "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]})
        self.cp.create(CLUSTERROLEBINDINGS, "", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}]})
        self.service("kube-system", "kube-dns", self.ip, [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
                     cluster_ip=DNS_SERVICE_IP)

    def service(self, namespace: str, name: str, address: str, ports: list[tuple[str, int, str]],
                cluster_ip: str | None = None) -> str:
        """A Service without a selector whose one endpoint is `address` (the node's, or the host's end of the veth
        for a host port exposed with host_service); returns its ClusterIP."""
        self.cp.ensure_namespace(namespace)
        svc = self.cp.create(SERVICES, namespace, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                                                   "spec": {"ports": [{"name": n, "port": p, "targetPort": p,
                                                                       "protocol": proto} for n, p, proto in ports],
                                                            **({"clusterIP": cluster_ip} if cluster_ip else {})}})
        self.cp.create(ENDPOINTSLICES, namespace, {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"{name}-testbed", "labels": {"kubernetes.io/service-name": name,
                                                               "endpointslice.kubernetes.io/managed-by": "testbed"}},
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports]})
        return svc["spec"]["clusterIP"]

    def host_service(self, namespace: str, name: str, port: int) -> str:
        """A server of the tests on the host's 127.0.0.1:port (MinIO, say), as the Service `name` pods reach at
        port `port`; returns its ClusterIP."""
        self.link.expose(port)
        return self.service(namespace, name, self.link.host_ip, [("tcp", port, "TCP")])

    def _proxy_config(self) -> Path:
        path = self.root / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig("kube-proxy"))},
            "hostnameOverride": NODE_NAME, "bindAddress": self.ip, "mode": "iptables",
            "clusterCIDR": self.link.pod_cidr,
            "healthzBindAddress": f"{self.ip}:{self._ports['proxy']}",
            "metricsBindAddress": f"127.0.0.1:{self._ports['proxy_metrics']}",
            "nodePortAddresses": [f"{self.ip}/32"], "oomScoreAdj": 0,
            # the conntrack table's size is the machine's, not the node's to set
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }))
        return path

    def _corefile(self) -> Path:
        path = self.root / "Corefile"
        path.write_text(f""".:53 {{
    bind {self.ip}
    errors
    health {self.ip}:{self._ports['dns_health']}
    ready {self.ip}:{self._ports['dns_ready']}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.kubeconfig('coredns')} testbed
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
""")
        return path

    def _start_scheduler(self, scheduler: Path) -> None:
        cfg = self.kubeconfig("kube-scheduler", inside=False)
        self._spawn("kube-scheduler", [
            scheduler, f"--kubeconfig={cfg}", f"--authentication-kubeconfig={cfg}",
            f"--authorization-kubeconfig={cfg}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={self._ports['scheduler']}", f"--cert-dir={self.root / 'scheduler-certs'}", "--v=1",
        ], self.root / "kube-scheduler.log")

    # --- what tests ask of it

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log})\n{p.tail(3000)}" for p in self.procs)

    def containers(self) -> list[str]:
        return self.ctr("containers", "list", "--quiet", check=False).stdout.split()

    # --- stop

    def stop(self) -> None:
        """Stop everything by PID and remove what the node made, whatever state it is in: first the pods, by the
        kubelet (which has the CNI plugins release their addresses), then whatever is left, by force."""
        by_name = {p.name: p for p in self.procs}
        containerd = by_name.get("containerd")
        alive = containerd is not None and containerd.proc.poll() is None
        if alive and "kubelet" in by_name and by_name["kubelet"].proc.poll() is None:
            with suppress(Exception):
                self._drain()
        for name in ("kube-scheduler", "coredns", "kube-proxy", "kubelet"):
            if name in by_name:
                by_name[name].stop()
        cids: list[str] = []
        if containerd is not None and alive:
            cids = self._remove_containers()
            containerd.stop()
        _kill_node_processes(self.cgroup_root, self.sock)
        self.procs.clear()
        if self.store is not None and self.store_lock is not None:  # what the CRI kept of deleted pods
            for kept in ("sandboxes", "containers"):
                shutil.rmtree(self.store / "io.containerd.grpc.v1.cri" / kept, ignore_errors=True)
            self.store_lock.close()
            self.store_lock = None
        _remove_cgroups(self.cgroup_root)
        self.link.delete()
        # what lives on the host's filesystem outside the node's root: the CNI plugins' cache of what they set up,
        # the kubelet's links into its podLogsDir
        for cache in Path("/var/lib/cni/results").glob("*"):
            if cache.name.startswith(f"{self.link.netns}-") or any(cid in cache.name for cid in cids):
                cache.unlink(missing_ok=True)
        for log in Path("/var/log/containers").glob("*.log"):
            with suppress(OSError):
                if str(log.readlink()).startswith(str(self.root)):
                    log.unlink()
        shutil.rmtree(self.root, ignore_errors=True)
        self.record.unlink(missing_ok=True)

    def _drain(self) -> None:
        """Delete every pod at once and wait (a while) for the kubelet to stop their containers and sandboxes."""
        for p in self.cp.list(PODS, ""):
            self.cp.delete(PODS, p["metadata"]["namespace"], p["metadata"]["name"], grace_seconds=0)
        wait_for("the kubelet to stop every pod", lambda: not self.ctr("tasks", "list", "--quiet").stdout.split(),
                 timeout=30, every=0.25)


def _kill_node_processes(cgroup_root: str, sock: Path, recorded: Iterable[tuple[int, str]] = ()) -> None:
    """Kill what a node started that is still alive: the processes `recorded` (pid, start time: a pid the kernel
    reused since is someone else's), containerd's shims (which name its socket) and anything in its pods' cgroups."""
    pids = {pid for pid, started in recorded if _start_time(pid) == started}
    for hierarchy in _cgroup_hierarchies():
        for procs in (hierarchy / cgroup_root).rglob("cgroup.procs"):
            with suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with suppress(OSError):
                if f"-address\0{sock}\0".encode() in (proc / "cmdline").read_bytes():
                    pids.add(int(proc.name))
    for pid in pids:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    wait_for("the node's leftover processes to exit", lambda: not any(Path(f"/proc/{p}").exists() for p in pids),
             timeout=30)


def _remove_cgroups(cgroup_root: str) -> None:
    for hierarchy in _cgroup_hierarchies():
        top = hierarchy / cgroup_root
        if not top.exists():
            continue
        for d in [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]:
            for _ in range(50):  # a cgroup whose last task just died is busy for a moment
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _start_time(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat): with the pid, what names one process for good."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


RECORDS = Path("/run/eyrie-testbed")


def reap_stale_nodes() -> list[str]:
    """Remove what nodes whose test process died without stopping them (SIGKILL, a crash) left behind: their
    processes and their control plane's, cgroups, veth, network namespace, forwarding rules and files, as each node's
    record (RECORDS/node-PORT.json, written as it starts) names them. Returns the records reaped."""
    reaped = []
    for record in sorted(RECORDS.glob("node-*.json")):
        try:
            doc = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        owner, started = doc["owner"]
        if _start_time(owner) == started:
            continue  # its test process is alive: the node is in use
        _kill_node_processes(doc["cgroup_root"], Path(doc["sock"]), [tuple(p) for p in doc["pids"]])
        _remove_cgroups(doc["cgroup_root"])
        link = Link(doc["api_port"])
        link.created = True
        link.delete()
        for cache in Path("/var/lib/cni/results").glob(f"{link.netns}-*"):
            cache.unlink(missing_ok=True)
        shutil.rmtree(doc["root"], ignore_errors=True)
        shutil.rmtree(doc["control_plane"], ignore_errors=True)
        record.unlink(missing_ok=True)
        reaped.append(record.name)
    return reaped


def _cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, ..., name=systemd) and the cgroup2 one, if any."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point, fstype = line.split()[4], line.split(" - ")[1].split()[0]
        if fstype in ("cgroup", "cgroup2"):
            out.append(Path(mount_point))
    return out


def pod_phase(cp: ControlPlane, ns: str, name: str) -> str:
    return ((cp.get(PODS, ns, name) or {}).get("status") or {}).get("phase", "")



@contextmanager
def running_node(root: Path, images: Iterable[Path] = ()) -> Iterator[Node]:
    """A control plane made for a node, and the node, stopped and removed on the way out."""
    with running_control_plane(root / "control-plane", node=NODE_NAME) as cp:
        node = Node(cp, root / "node")
        try:
            node.start(images)
            yield node
        except BaseException:
            sys.stderr.write(node.logs())
            raise
        finally:
            node.stop()
