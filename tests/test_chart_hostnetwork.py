"""hostNetwork: the server's pods on the node's network, for clusters whose control plane cannot reach pod IPs (EKS
with a Calico or Cilium overlay, some k3s setups): every webhook call would time out ("context deadline exceeded").

The apiserver then calls the node's address on the port the pod listens on, so that port is the node's: away from
443/8443/9090 and the Kubernetes components' own ports, at or above 1024 (the server has no capabilities), the same
in the container, the Service's targetPort and the probes. Two replicas cannot share a node's port: the explicit
hostPort makes the scheduler keep them apart, and a rollout replaces a replica before it starts its successor (a
surge pod would need a node with the port free, which a cluster with as many nodes as replicas does not have).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    _values_comment,
    dig,
    find,
    find_all,
    helm,
    pod_specs,
    render_values,
    template,
)


def _server(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = dig(find(objects, "Deployment"), "spec", "template", "spec")
    (container,) = spec["containers"]
    return spec, container


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _ports(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in container["ports"]}


def test_off_by_default():
    spec, container = _server(render_values("defaults"))
    assert "hostNetwork" not in spec and "dnsPolicy" not in spec
    assert {n: p["containerPort"] for n, p in _ports(container).items()} == {"https": 8443, "metrics": 9090}
    assert all("hostPort" not in p for p in container["ports"])


def test_pods_on_the_node_network_listen_on_the_host_ports():
    objects = render_values("host-network")
    spec, container = _server(objects)
    assert spec["hostNetwork"] is True
    # ClusterFirst on the host network would resolve with the node's resolv.conf, not the cluster's DNS.
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    ports = _ports(container)
    assert {n: (p["containerPort"], p["hostPort"]) for n, p in ports.items()} == {
        "https": (10270, 10270),
        "metrics": (10271, 10271),
    }
    # The server binds what the container declares.
    assert _arg(container["args"], "--port") == "10270"
    assert _arg(container["args"], "--metrics-port") == "10271"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "https"


def test_the_service_still_takes_the_apiservers_port_to_the_pods_port():
    objects = render_values("host-network")
    service = find(objects, "Service")
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert (by_name["https"]["port"], by_name["https"]["targetPort"]) == (443, "https")
    assert (by_name["metrics"]["port"], by_name["metrics"]["targetPort"]) == (9090, "metrics")
    _, container = _server(objects)
    # Named targetPorts resolve to the container's ports of those names.
    assert set(_ports(container)) == {"https", "metrics"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(objects, kind)["webhooks"]:
            assert hook["clientConfig"]["service"]["port"] == 443


def test_values_say_which_container_port_each_service_port_reaches():
    """values.yaml said the Service's port reaches the container's 8443, which on the host network listens on
    hostNetworkPorts.https instead: each Service port's comment names the container port it reaches in both cases."""
    _, container = _server(render_values("defaults"))
    for name, field in (("https", "port"), ("metrics", "metricsPort")):
        comment = " ".join(_values_comment(f"service.{field}").split())
        assert str(_ports(container)[name]["containerPort"]) in comment, field
        assert f"hostNetworkPorts.{name} with hostNetwork" in comment, field


def test_ports_are_settable():
    objects = template(
        "--set", "hostNetwork=true", "--set", "hostNetworkPorts.https=12443", "--set", "hostNetworkPorts.metrics=12090"
    )
    _, container = _server(objects)
    assert {n: (p["containerPort"], p["hostPort"]) for n, p in _ports(container).items()} == {
        "https": (12443, 12443),
        "metrics": (12090, 12090),
    }
    assert (_arg(container["args"], "--port"), _arg(container["args"], "--metrics-port")) == ("12443", "12090")


def test_ports_only_apply_on_the_host_network():
    _, container = _server(template("--set", "hostNetworkPorts.https=12443"))
    assert _ports(container)["https"]["containerPort"] == 8443 and "hostPort" not in _ports(container)["https"]


def test_a_rollout_replaces_a_replica_before_starting_its_successor():
    deployment = find(render_values("host-network"), "Deployment")
    # maxSurge 1 with maxUnavailable 0 would wait for ever for a node with the port free on a cluster with as many
    # (eligible) nodes as replicas.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert find(render_values("defaults"), "Deployment")["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }


def test_only_the_server_runs_on_the_host_network():
    # The certs Jobs, the renewal CronJob, the cleanup Job and the helm test pod call the apiserver, which works from
    # the pod network: they keep it (and the Pod Security baseline they meet).
    for where, spec in pod_specs(render_values("host-network")):
        if not where.startswith("Deployment/"):
            assert "hostNetwork" not in spec and "hostPort" not in str(spec), where


def test_network_policy_lets_the_apiserver_in_on_the_host_port():
    policy = find(render_values("host-network"), "NetworkPolicy")
    (webhook_rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "https"]
    # Host-network traffic from the control plane has no pod or namespace to select: no `from`, open to all.
    assert "from" not in webhook_rule
    assert webhook_rule["ports"] == [{"port": "https", "protocol": "TCP"}]


def test_the_service_monitor_scrapes_the_metrics_port():
    objects = render_values("host-network")
    (monitor,) = find_all(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def _notes(*args: str) -> str:
    out = helm("install", RELEASE, str(CHART), "--dry-run=client", "-n", NAMESPACE, *args).stdout
    assert "NOTES:" in out
    return out.split("NOTES:", 1)[1]


def test_notes_say_which_node_port_the_control_plane_must_reach():
    notes = _notes("--set", "hostNetwork=true")
    assert "hostNetwork is on" in notes and "TCP 10270" in notes
    assert "hostNetwork" not in _notes()
    single = _notes("--set", "hostNetwork=true", "--set", "replicaCount=1")
    assert "and so does every rollout on the host network" in single
    assert "every rollout" not in _notes("--set", "replicaCount=1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--set", "hostNetwork=yes"], "hostNetwork", id="not-a-boolean"),
        pytest.param(["--set", "hostNetworkPorts.https=443"], "https", id="privileged-port"),
        pytest.param(["--set", "hostNetworkPorts.metrics=80"], "metrics", id="privileged-metrics-port"),
        pytest.param(["--set", "hostNetworkPorts.https=70000"], "https", id="beyond-65535"),
        pytest.param(["--set", "hostNetworkPorts.http=10270"], "http", id="unknown-port-name"),
        pytest.param(
            ["--set", "hostNetwork=true", "--set", "hostNetworkPorts.metrics=10270"],
            "hostNetworkPorts.https and hostNetworkPorts.metrics are both 10270",
            id="one-port-twice",
        ),
        pytest.param(  # helm drops a null before the schema sees it: it rendered containerPort 0
            ["--set", "hostNetwork=true", "--set", "hostNetworkPorts.https=null"],
            "at '/hostNetworkPorts': missing property 'https'",
            id="null-port",
        ),
        pytest.param(
            ["--set", "hostNetwork=true", "--set", "hostNetworkPorts=null"],
            "hostNetworkPorts.https is required with hostNetwork",
            id="null-ports",
        ),
        pytest.param(
            ["--set", "hostNetwork=true", "--set", "hostNetworkPorts.https=10250"],
            "hostNetworkPorts.https (10250) is the kubelet's port",
            id="kubelet-port",
        ),
        pytest.param(
            ["--set", "hostNetwork=true", "--set", "hostNetworkPorts.metrics=6443"],
            "hostNetworkPorts.metrics (6443) is the kube-apiserver's port",
            id="apiserver-port",
        ),
    ],
)
def test_refused(args, message):
    proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *args, check=False)
    assert proc.returncode != 0, f"helm accepted {args}"
    assert message in proc.stderr, proc.stderr


def test_kubernetes_ports_are_no_concern_off_the_host_network():
    # Unused values: the pod's own network has its own ports.
    proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--set", "hostNetworkPorts.https=10250", check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "address",
    ["0.0.0.0", "::", "[::]", "10.0.0.7", "fd00::7", "fd00::1", "10.127.0.1", "::10", "::ffff:10.0.0.1", "::ffff:7f:1"],
)
def test_the_listen_address_is_given_to_the_server_only_where_set(address: str) -> None:
    """Unset, the server listens on every address over IPv6 and IPv4 (an IPv6-only cluster's probes and API server
    reach the pod by its IPv6 address: tests/test_server.py); set, it narrows that."""
    assert "--host" not in _server(template())[1]["args"]
    assert _arg(_server(template("--set-string", f"listenAddress={address}"))[1]["args"], "--host") == address


@pytest.mark.parametrize(
    "address", ["my host", "my-node.local", "0177.0.0.1", "010.0.0.7", "2130706433", "1.2.3", "256.0.0.1"]
)
def test_a_listen_address_that_is_no_address_is_refused(address: str) -> None:
    """glibc reads 0177.0.0.1 as octal (127.0.0.1, loopback) and 010.0.0.7 as 8.0.0.7, and a bare integer as a whole
    address: only dotted decimal is taken."""
    proc = helm(
        "template", RELEASE, str(CHART), "-n", NAMESPACE, "--set-string", f"listenAddress={address}", check=False
    )
    assert proc.returncode != 0 and "/listenAddress" in proc.stderr, (address, proc.stderr)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "[::1]",
        "0:0:0:0:0:0:0:1",
        "::0001",
        "::ffff:127.0.0.1",
        "localhost",
        "LocalHost",
        # The same addresses as glibc also reads them: IPv4-mapped 127.0.0.1 in hex, ::1 with a dotted tail.
        "::ffff:7f00:1",
        "0:0:0:0:0:ffff:7f00:1",
        "::0.0.0.1",
        "0:0:0:0:0:0:0.0.0.1",
    ],
)
@pytest.mark.parametrize("host_network", ["false", "true"])
def test_a_loopback_listen_address_is_refused(address: str, host_network: str) -> None:
    """Rendered, the server listened where nothing outside its pod reaches: every webhook call and probe failed."""
    proc = helm(
        "template",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--set",
        f"hostNetwork={host_network}",
        "--set-string",
        f"listenAddress={address}",
        check=False,
    )
    assert proc.returncode != 0, f"helm accepted listenAddress {address}"
    assert f'listenAddress "{address}" is a loopback address' in proc.stderr, proc.stderr
    assert 'Leave listenAddress empty (every address, IPv6 and IPv4), or set "0.0.0.0"' in proc.stderr
