"""The real node (node.py): it registers Ready at its own address, runs pods from imported images on a bridge, gives
them cluster DNS and Services, serves logs and exec to the API server, refuses images it does not have, and leaves
nothing behind when it stops."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .node import NODE_NAME, NODES, RECORDS, SERVICES, Link, Node, busybox_image, reap_stale_nodes, run, running_node
from .testbed import KUBERNETES_SERVICE_IP, PODS, ControlPlane, versions, wait_for


def vm_addresses() -> set[str]:
    """Every address of the machine's own interfaces but loopback (the VM's, which nothing of the node may use)."""
    out = set()
    for line in run("ip", "-o", "addr").stdout.splitlines():
        dev, addr = line.split()[1], line.split()[3].split("/")[0]
        if dev != "lo" and not dev.startswith("eyh"):
            out.add(addr)
    return out


def pod(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, **spec,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": command}]}}


def phase(cp: ControlPlane, ns: str, name: str) -> str:
    return ((cp.get(PODS, ns, name) or {}).get("status") or {}).get("phase", "")


def finished(cp: ControlPlane, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        p = cp.get(PODS, ns, name) or {}
        return p if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None
    try:
        return wait_for(f"pod {ns}/{name} to finish", done, timeout=timeout, every=0.25)
    except AssertionError as e:
        events = [f"{ev.get('reason')}: {ev.get('message')}" for ev in cp.events(ns, name)]
        raise AssertionError(f"{e}\nstatus: {(cp.get(PODS, ns, name) or {}).get('status')}\nevents: {events}") from e


@pytest.fixture
def ns(node: Node, request: pytest.FixtureRequest) -> Any:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    node.cp.ensure_namespace(name)
    yield name
    node.cp.delete(("", "v1", "namespaces"), "", name)


def test_the_node_registers_ready_at_its_own_address_only(node: Node) -> None:
    doc = node.cp.get(NODES, "", NODE_NAME)
    assert doc is not None
    addresses = {a["type"]: a["address"] for a in doc["status"]["addresses"]}
    assert addresses["InternalIP"] == node.ip
    assert not vm_addresses() & set(addresses.values()), addresses
    assert doc["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert doc["status"]["nodeInfo"]["kubeletVersion"] == versions()["KUBERNETES"]  # the control plane's build
    # the node's processes listen on loopback or inside its own network namespace, never on the VM's address
    for proc in node.procs:
        for addr in listening(proc.proc.pid):
            assert addr in ("127.0.0.1", node.ip, "::1") or ipaddress.ip_address(addr) in ipaddress.ip_network(
                node.link.pod_cidr), f"{proc.name} listens on {addr}"


def listening(pid: int) -> set[str]:
    """The local addresses of the TCP sockets `pid` listens on (read in its own network namespace)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                raw = bytes.fromhex(cols[1].split(":")[0][:width])
                addr = ipaddress.ip_address(raw[::-1] if width == 8 else b"".join(raw[i:i + 4][::-1]
                                                                                 for i in range(0, 16, 4)))
                out.add(str(addr.ipv4_mapped or addr) if isinstance(addr, ipaddress.IPv6Address) else str(addr))
    return out


def test_a_pod_runs_to_succeeded_on_the_bridge_with_cluster_dns_and_logs(node: Node,
                                                                                               ns: str) -> None:
    image = busybox_image()[0]
    # busybox's TLS cannot talk to the API server (the operator's pod does, with its token): plain HTTP to its TLS
    # port gets Go's answer to that, which proves the Service's route to the server on the host's loopback
    script = ("nslookup kubernetes.default.svc.cluster.local && "
              "(wget -O - http://kubernetes.default.svc:443/ 2>&1; true) && echo done")
    node.cp.create(PODS, ns, pod("hello", image, ["sh", "-c", script]))
    done = finished(node.cp, ns, "hello")
    logs = node.cp.kubectl("logs", "hello", namespace=ns, check=True).stdout  # the API server reached the kubelet
    assert done["status"]["phase"] == "Succeeded", (done["status"], logs)
    assert ipaddress.ip_address(done["status"]["podIP"]) in ipaddress.ip_network(node.link.pod_cidr)
    # the host reaches the pod through the veth, never the VM's interface
    assert f"dev {node.link.host_if}" in run("ip", "-o", "route", "get", done["status"]["podIP"]).stdout
    assert done["status"]["hostIP"] == node.ip
    assert KUBERNETES_SERVICE_IP in logs  # cluster DNS answered with the Service's address
    assert "400 Bad Request" in logs  # the API server itself answered, through the Service
    assert logs.rstrip().endswith("done")


def test_a_service_reaches_its_pods_by_name_and_exec_runs_in_them(node: Node, ns: str) -> None:
    image = busybox_image()[0]
    port = 8080
    web = pod("web", image, ["sh", "-c", f"mkdir -p /www && echo served-by-$(hostname) > /www/index.html && "
                                         f"exec httpd -f -p {port} -h /www"])
    web["spec"]["restartPolicy"] = "Always"
    web["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    node.cp.create(PODS, ns, web)
    node.cp.create(SERVICES, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                                  "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": port}]}})
    wait_for("pod web Ready", lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in (
        (node.cp.get(PODS, ns, "web") or {}).get("status") or {}).get("conditions") or []), timeout=120, every=0.25)
    node.cp.create(PODS, ns, pod("client", image, ["wget", "-q", "-O", "-", f"http://web.{ns}.svc/"]))
    done = finished(node.cp, ns, "client")
    logs = node.cp.kubectl("logs", "client", namespace=ns, check=True).stdout
    assert done["status"]["phase"] == "Succeeded", (done["status"], logs)
    assert logs.strip() == "served-by-web"
    out = node.cp.kubectl("exec", "web", "--", "cat", "/www/index.html", namespace=ns, check=True).stdout
    assert out.strip() == "served-by-web"


def test_an_image_the_node_does_not_have_is_err_image_never_pull(node: Node, ns: str) -> None:
    node.cp.create(PODS, ns, pod("absent", "ghcr.io/eyrie-dev/not-on-this-node:0.0.0", ["true"]))

    def waiting() -> dict[str, Any] | None:
        for s in ((node.cp.get(PODS, ns, "absent") or {}).get("status") or {}).get("containerStatuses") or []:
            return (s.get("state") or {}).get("waiting")
        return None
    state = wait_for("the pod's container to wait", lambda: (w := waiting()) and w.get("reason") != "ContainerCreating"
                     and w, timeout=60)
    assert state["reason"] == "ErrImageNeverPull", state
    assert "not-on-this-node" in state["message"]


def test_a_stopped_node_leaves_no_process_namespace_link_rule_cgroup_mount_or_file(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("node-teardown")
    with running_node(root, images=[busybox_image()[1]]) as n:
        n.cp.create(PODS, "default", pod("sleeper", busybox_image()[0], ["sleep", "3600"]))
        wait_for("pod sleeper Running", lambda: phase(n.cp, "default", "sleeper") == "Running", timeout=120)
        containers = n.containers()
        assert len(containers) == 2, containers  # the sandbox and the container, left running on purpose
        netns = {Path(ns["path"]) for c in containers for ns in json.loads(n.ctr("containers", "info", c).stdout)[
            "Spec"]["linux"]["namespaces"] if ns["type"] == "network" and "/netns/" in ns.get("path", "")}
        assert len(netns) == 1 and next(iter(netns)).exists(), netns
        assert next(iter(netns)).is_relative_to(root), netns  # not the host's /run/netns
        pids = [p.proc.pid for p in n.procs]
        link, cgroup_root, sock = n.link, n.cgroup_root, n.sock
    from .node import _cgroup_hierarchies

    assert not any(p.exists() for p in netns)  # the pod's network namespace
    assert not [c for c in Path("/var/lib/cni/results").glob("*") if any(cid in c.name for cid in containers)]

    assert all(not Path(f"/proc/{p}").exists() for p in pids)
    assert not any(sock.as_posix().encode() in (p / "cmdline").read_bytes() for p in Path("/proc").iterdir()
                   if p.name.isdigit() and (p / "cmdline").exists())
    assert link.netns not in run("ip", "netns", "list").stdout
    assert link.host_if not in run("ip", "-o", "link").stdout
    assert link.chain not in run("iptables", "-t", "nat", "-S").stdout
    assert not any((h / cgroup_root).exists() for h in _cgroup_hierarchies())
    assert str(root) not in Path("/proc/self/mountinfo").read_text()
    assert list(root.iterdir()) == []
    assert not (RECORDS / f"node-{link.api_port}.json").exists()


def test_a_node_whose_test_process_died_is_reaped_by_the_next(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A test process killed with SIGKILL stops nothing: the next node to start finds its record, sees its owner
    dead, and removes what it left (processes, cgroups, veth, namespace, rules, files)."""
    root = tmp_path_factory.mktemp("node-orphan")
    script = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
from cluster import node
from pathlib import Path
with node.running_node(Path({str(root)!r})) as n:
    print(n.cp.api_port, flush=True)
    time.sleep(3600)
"""
    orphan = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        port = int(orphan.stdout.readline())  # its node is up
    finally:
        orphan.kill()  # SIGKILL: no teardown
        orphan.wait(30)
    doc = json.loads((RECORDS / f"node-{port}.json").read_text())
    pids = [pid for pid, _ in doc["pids"]]
    link = Link(port)
    assert link.netns in run("ip", "netns", "list").stdout and any(Path(f"/proc/{p}").exists() for p in pids)
    assert reap_stale_nodes() == [f"node-{port}.json"]
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
    assert link.netns not in run("ip", "netns", "list").stdout
    assert link.host_if not in run("ip", "-o", "link").stdout and link.chain not in run("iptables", "-t", "nat",
                                                                                          "-S").stdout
    assert not (root / "node").exists()
