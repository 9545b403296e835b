"""Where a pod could be scheduled: nodeName, nodeSelector, required node affinity, taints and tolerations,
ExtendedResourceToleration and offered resources, as Kubernetes decides them; garbage never matches."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from webhook.cluster import (
    ClusterView,
    Taint,
    build_view,
    container_resources,
    extended_resource_names,
    format_pools,
    requested_resources,
    toleration_tolerates,
)
from webhook.config import ClusterSettings, PoolSettings, Settings, load_settings


def node(
    name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None, alloc: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": alloc if alloc is not None else {"nvidia.com/gpu": "8"}},
    }


CLUSTER = [
    node("a1", {"pool": "a", "gpu": "a100", "cores": "8", "zone": "z1"}),
    node("a2", {"pool": "a", "gpu": "a100", "cores": "8", "zone": "z1"}),
    node(
        "h1",
        {"pool": "h", "gpu": "h100", "cores": "16", "zone": "z2"},
        alloc={"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "4"},
    ),
    node("l1", {"pool": "l", "gpu": "l4", "zone": "z2"}, alloc={"nvidia.com/gpu": "1"}),
    node("cpu", {"pool": "cpu"}, alloc={}),
]


@pytest.fixture(scope="module")
def view() -> ClusterView:
    return build_view(CLUSTER, Settings())


def landing(view: ClusterView, spec: dict[str, Any], resources: Any = (), gpu_only: bool = True) -> set[str]:
    return {n for c in view.eligible(spec, resources, gpu_only) for n in c.nodes}


def expr(key: str, op: str, *values: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


def affinity(*terms: list[dict[str, Any]], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out = [{"matchExpressions": t} for t in terms]
    if fields is not None:
        out.append({"matchFields": fields})
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": out}}}
    }


GPU = {"a1", "a2", "h1", "l1"}

SELECTION = [
    pytest.param({}, GPU, id="no-rules"),
    pytest.param({"nodeName": "h1"}, {"h1"}, id="nodeName"),
    pytest.param({"nodeName": "ghost"}, set(), id="nodeName-unknown"),
    pytest.param({"nodeSelector": {"gpu": "a100"}}, {"a1", "a2"}, id="selector"),
    pytest.param({"nodeSelector": {"gpu": "a100", "zone": "z2"}}, set(), id="selector-and"),
    pytest.param({"nodeSelector": {"kubernetes.io/hostname": "a2"}}, {"a2"}, id="selector-hostname"),
    pytest.param({"nodeSelector": {"cores": 8}}, set(), id="selector-int-value-garbage"),
    pytest.param({"nodeSelector": ["gpu"]}, set(), id="selector-not-a-map"),
    pytest.param({"nodeSelector": None}, GPU, id="selector-null"),
    pytest.param(affinity([expr("gpu", "In", "a100", "l4")]), {"a1", "a2", "l1"}, id="In"),
    pytest.param(affinity([expr("gpu", "NotIn", "a100")]), {"h1", "l1"}, id="NotIn"),
    pytest.param(affinity([expr("cores", "NotIn", "8")]), {"h1", "l1"}, id="NotIn-absent-label-matches"),
    pytest.param(affinity([expr("cores", "Exists")]), {"a1", "a2", "h1"}, id="Exists"),
    pytest.param(affinity([expr("cores", "DoesNotExist")]), {"l1"}, id="DoesNotExist"),
    pytest.param(affinity([expr("cores", "Gt", "8")]), {"h1"}, id="Gt"),
    pytest.param(affinity([expr("cores", "Lt", "16")]), {"a1", "a2"}, id="Lt"),
    pytest.param(affinity([expr("cores", "Gt", "+7")]), set(), id="Gt-sign-is-no-label-value"),
    pytest.param(affinity([expr("cores", "Gt", "-1")]), set(), id="Gt-negative-is-no-label-value"),
    pytest.param(affinity([expr("cores", "Gt", "007")]), {"a1", "a2", "h1"}, id="Gt-leading-zeros"),
    pytest.param(affinity([expr("gpu", "Gt", "1")]), set(), id="Gt-label-not-a-number"),
    pytest.param(affinity([expr("cores", "Gt", "eight")]), set(), id="Gt-value-not-a-number"),
    pytest.param(affinity([expr("cores", "Gt", "1_0")]), set(), id="Gt-underscore"),
    pytest.param(affinity([expr("cores", "Gt", " 7")]), set(), id="Gt-space"),
    pytest.param(affinity([expr("cores", "Gt", "99999999999999999999")]), set(), id="Gt-overflow"),
    pytest.param(affinity([expr("cores", "Gt", "1", "2")]), set(), id="Gt-two-values"),
    pytest.param(affinity([expr("cores", "Gt")]), set(), id="Gt-no-value"),
    pytest.param(affinity([expr("gpu", "In")]), set(), id="In-no-values"),
    pytest.param(affinity([expr("gpu", "NotIn")]), set(), id="NotIn-no-values-is-invalid"),
    pytest.param(affinity([expr("gpu", "Exists", "a100")]), set(), id="Exists-with-values"),
    pytest.param(affinity([expr("gpu", "In", "a100", 5)]), set(), id="In-non-string-value"),
    pytest.param(affinity([expr("gpu", "In", "not a label value!")]), set(), id="In-invalid-label-value"),
    pytest.param(affinity([expr("gpu", "Matches", "a.*")]), set(), id="unknown-operator"),
    pytest.param(affinity([{"key": "gpu", "operator": ["In"], "values": ["a100"]}]), set(), id="operator-a-list"),
    pytest.param(affinity([{"key": "gpu", "operator": {}, "values": ["a100"]}]), set(), id="operator-a-map"),
    pytest.param(affinity([{"key": ["gpu"], "operator": "Exists"}]), set(), id="key-a-list"),
    pytest.param(
        affinity(fields=[{"key": "metadata.name", "operator": ["In"], "values": ["a2"]}]), set(), id="field-op-list"
    ),
    pytest.param(affinity([expr("", "DoesNotExist")]), set(), id="empty-key"),
    pytest.param(affinity([{"operator": "DoesNotExist"}]), set(), id="missing-key"),
    pytest.param(affinity([expr("bad key", "DoesNotExist")]), set(), id="invalid-key"),
    pytest.param(affinity([expr("gpu", "In", "a100"), expr("zone", "In", "z2")]), set(), id="expressions-anded"),
    pytest.param(affinity([expr("gpu", "In", "a100")], [expr("gpu", "In", "l4")]), {"a1", "a2", "l1"}, id="terms-ored"),
    pytest.param(
        affinity([expr("gpu", "Bogus")], [expr("gpu", "In", "l4")]), {"l1"}, id="bad-term-does-not-spoil-good-one"
    ),
    pytest.param(affinity([]), set(), id="empty-term-matches-nothing"),
    pytest.param(
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
        set(),
        id="required-without-terms",
    ),
    pytest.param(
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
        set(),
        id="required-empty-terms",
    ),
    pytest.param(
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}},
        set(),
        id="required-garbage",
    ),
    pytest.param({"affinity": "x"}, set(), id="affinity-garbage"),
    pytest.param(
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": {"matchExpressions": [expr("gpu", "In", "l4")]}}
                    ]
                }
            }
        },
        GPU,
        id="preferred-does-not-filter",
    ),
    pytest.param(affinity(fields=[expr("metadata.name", "In", "a2")]), {"a2"}, id="matchFields-In"),
    pytest.param(affinity(fields=[expr("metadata.name", "NotIn", "a2")]), GPU - {"a2"}, id="matchFields-NotIn"),
    pytest.param(affinity(fields=[expr("metadata.name", "In", "a1", "a2")]), set(), id="matchFields-two-values"),
    pytest.param(affinity(fields=[expr("metadata.name", "Exists")]), set(), id="matchFields-Exists"),
    pytest.param(affinity(fields=[expr("metadata.uid", "NotIn", "x")]), set(), id="matchFields-other-field"),
    pytest.param(
        {**affinity([expr("gpu", "In", "a100")]), "nodeSelector": {"zone": "z1"}},
        {"a1", "a2"},
        id="selector-and-affinity",
    ),
    pytest.param({"nodeName": "a1", "nodeSelector": {"gpu": "h100"}}, set(), id="nodeName-and-selector"),
    pytest.param(
        affinity([expr("kubernetes.io/hostname", "In", "a1", "h1")]), {"a1", "h1"}, id="hostname-affinity-per-node"
    ),
    pytest.param({"nodeName": 5}, set(), id="nodeName-garbage"),
]


@pytest.mark.parametrize(("spec", "nodes"), SELECTION)
def test_node_selection(view: ClusterView, spec: dict[str, Any], nodes: set[str]) -> None:
    assert landing(view, spec) == nodes


def test_gpu_only_and_non_gpu_groups(view: ClusterView) -> None:
    assert landing(view, {"nodeSelector": {"pool": "cpu"}}) == set()
    assert landing(view, {"nodeSelector": {"pool": "cpu"}}, gpu_only=False) == {"cpu"}


@pytest.mark.parametrize(
    ("resources", "nodes"),
    [
        pytest.param(["nvidia.com/mig-3g.40gb"], {"h1"}, id="offered-resource"),
        pytest.param({"nvidia.com/gpu": Decimal(2)}, {"a1", "a2", "h1"}, id="amount-fits-one-node"),
        pytest.param({"nvidia.com/gpu": Decimal(8)}, {"a1", "a2"}, id="amount-too-big-for-some"),
        pytest.param({"nvidia.com/gpu": Decimal("0.5")}, GPU, id="fraction-needs-any"),
        pytest.param(["nvidia.com/mig-1g.5gb"], set(), id="not-offered"),
        pytest.param("nvidia.com/mig-3g.40gb", {"h1"}, id="a-single-name"),
    ],
)
def test_offered_resources(view: ClusterView, resources: Any, nodes: set[str]) -> None:
    assert landing(view, {}, resources) == nodes


# ---------------------------------------------------------------------------------------------------------------
# Taints and tolerations

TAINT = Taint("dedicated", "ml", "NoSchedule")

TOLERATIONS = [
    pytest.param(
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}, TAINT, True, id="equal"
    ),
    pytest.param({"key": "dedicated", "value": "ml"}, TAINT, True, id="default-operator-equal-empty-effect"),
    pytest.param({"key": "dedicated", "value": "other"}, TAINT, False, id="equal-other-value"),
    pytest.param({"key": "dedicated"}, TAINT, False, id="equal-no-value-vs-value"),
    pytest.param({"key": "gpu"}, Taint("gpu", "", "NoSchedule"), True, id="equal-no-value-vs-empty"),
    pytest.param({"key": "gpu", "value": ""}, Taint("gpu", "", "NoSchedule"), True, id="equal-empty-value"),
    pytest.param({"key": "dedicated", "operator": "Exists"}, TAINT, True, id="exists"),
    pytest.param(
        {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, TAINT, False, id="exists-other-effect"
    ),
    pytest.param({"operator": "Exists"}, TAINT, True, id="empty-key-exists-all"),
    pytest.param({"operator": "Exists", "effect": "NoSchedule"}, TAINT, True, id="empty-key-exists-effect"),
    pytest.param({"operator": "Exists", "effect": "NoExecute"}, TAINT, False, id="empty-key-exists-wrong-effect"),
    pytest.param({"value": "ml"}, TAINT, False, id="empty-key-equal-is-invalid"),
    pytest.param({"key": "other", "operator": "Exists"}, TAINT, False, id="other-key"),
    pytest.param({"key": "dedicated", "operator": "exists"}, TAINT, False, id="operator-case"),
    pytest.param({"key": "dedicated", "operator": "Like", "value": "ml"}, TAINT, False, id="unknown-operator"),
    pytest.param({"key": "dedicated", "operator": "Exists", "effect": 5}, TAINT, False, id="effect-not-string"),
    pytest.param({"key": 5, "operator": "Exists"}, TAINT, False, id="key-not-string"),
    pytest.param({"key": "dedicated", "value": 1}, Taint("dedicated", "1", "NoSchedule"), False, id="value-not-string"),
    pytest.param({"key": "tier", "operator": "Lt", "value": "5"}, Taint("tier", "3", "NoSchedule"), True, id="Lt"),
    pytest.param(
        {"key": "tier", "operator": "Lt", "value": "3"}, Taint("tier", "3", "NoSchedule"), False, id="Lt-equal"
    ),
    pytest.param({"key": "tier", "operator": "Gt", "value": "2"}, Taint("tier", "3", "NoSchedule"), True, id="Gt"),
    pytest.param(
        {"key": "tier", "operator": "Gt", "value": "x"}, Taint("tier", "3", "NoSchedule"), False, id="Gt-garbage"
    ),
    pytest.param(
        {"key": "tier", "operator": "Gt", "value": "2"},
        Taint("tier", "high", "NoSchedule"),
        False,
        id="Gt-taint-not-number",
    ),
    pytest.param("garbage", TAINT, False, id="not-a-mapping"),
]


@pytest.mark.parametrize(("tol", "taint", "tolerated"), TOLERATIONS)
def test_toleration_tolerates(tol: Any, taint: Taint, tolerated: bool) -> None:
    assert toleration_tolerates(tol, taint) is tolerated


def tainted(*taints: dict[str, str], alloc: dict[str, str] | None = None, ert: bool = True) -> ClusterView:
    return build_view(
        [node("t", {"pool": "t"}, list(taints), alloc)],
        Settings(cluster=ClusterSettings(extended_resource_toleration="on" if ert else "off")),
    )


GPU_LIMIT = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
MIG_LIMIT = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}

TAINT_CASES = [
    pytest.param([{"key": "k", "value": "v", "effect": "NoSchedule"}], {}, True, False, id="noschedule-untolerated"),
    pytest.param([{"key": "k", "value": "v", "effect": "NoExecute"}], {}, True, False, id="noexecute-untolerated"),
    pytest.param([{"key": "k", "value": "v", "effect": "PreferNoSchedule"}], {}, True, True, id="prefer-ignored"),
    pytest.param([{"key": "k", "value": "v", "effect": "Bogus"}], {}, True, True, id="unknown-effect-ignored"),
    pytest.param(
        [{"key": "k", "value": "v", "effect": "NoExecute"}],
        {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]},
        True,
        True,
        id="noexecute-tolerated-for-a-while",
    ),
    pytest.param(
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        GPU_LIMIT,
        True,
        True,
        id="ert-gpu-taint",
    ),
    pytest.param(
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}], GPU_LIMIT, False, False, id="ert-off"
    ),
    pytest.param(
        [{"key": "nvidia.com/gpu", "effect": "NoExecute"}], GPU_LIMIT, True, False, id="ert-not-for-noexecute"
    ),
    pytest.param(
        [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        MIG_LIMIT,
        True,
        False,
        id="ert-only-for-the-resource-named",
    ),
    pytest.param(
        [{"key": "nvidia.com/mig-3g.40gb", "effect": "NoSchedule"}], MIG_LIMIT, True, True, id="ert-mig-resource"
    ),
    pytest.param(
        [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        {"initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "0"}}}]},
        True,
        True,
        id="ert-init-container-any-amount",
    ),
    pytest.param(
        [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}], GPU_LIMIT, True, False, id="aks-sku-taint-not-covered"
    ),
    pytest.param(
        [{"key": "k", "value": "v", "effect": "NoSchedule"}],
        {"nodeName": "t"},
        True,
        True,
        id="nodeName-skips-noschedule",
    ),
    pytest.param(
        [{"key": "k", "value": "v", "effect": "NoExecute"}],
        {"nodeName": "t"},
        True,
        False,
        id="nodeName-still-checks-noexecute",
    ),
    pytest.param(
        [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}],
        {"tolerations": [{"key": "a", "operator": "Exists"}]},
        True,
        False,
        id="every-taint-needs-one",
    ),
    pytest.param([{"key": "a", "effect": "NoSchedule"}], {"tolerations": "all"}, True, False, id="tolerations-garbage"),
]


@pytest.mark.parametrize(("taints", "spec", "ert", "eligible"), TAINT_CASES)
def test_taints(taints: list[dict[str, str]], spec: dict[str, Any], ert: bool, eligible: bool) -> None:
    assert bool(tainted(*taints, ert=ert).eligible(spec)) is eligible


def _kubelet(version: str) -> dict[str, Any]:
    return {"status": {"nodeInfo": {"kubeletVersion": version}}}


@pytest.mark.parametrize(
    ("labels", "setting", "providers", "plugin", "extra"),
    [
        pytest.param({"cloud.google.com/gke-nodepool": "a"}, "auto", ["all"], True, {}, id="gke"),
        pytest.param({"eks.amazonaws.com/nodegroup": "a"}, "auto", ["all"], True, {}, id="eks"),
        pytest.param({"karpenter.sh/nodepool": "a"}, "auto", ["all"], True, {}, id="karpenter"),
        pytest.param({"kubernetes.azure.com/agentpool": "a"}, "auto", ["all"], True, {}, id="aks"),
        # an EKS self-managed node group carries no EKS label: its kubelet's version tells
        pytest.param({"pool": "a"}, "auto", ["all"], True, _kubelet("v1.30.4-eks-a737599"), id="eks-self-managed"),
        pytest.param(
            {},
            "auto",
            ["all"],
            True,
            {"metadata": {"annotations": {"oci.oraclecloud.com/node-pool-id": "ocid1.nodepool.oc1..a"}}},
            id="oke",
        ),
        # a self-managed cluster: the plugin is off upstream (k3s, kubeadm), whatever label names its pools
        pytest.param({"pool": "a"}, "auto", ["all"], False, {}, id="k3s"),
        pytest.param({"nodepool": "gpu"}, "auto", ["all"], False, {}, id="k3s-with-ovh-pool-label"),
        # bare agentpool is AKS's legacy pool label, but a generic name: AKS shows by kubernetes.azure.com/agentpool
        pytest.param({"agentpool": "gpu"}, "auto", ["all"], False, {}, id="k3s-with-aks-legacy-pool-label"),
        pytest.param({"pool": "a"}, "auto", ["all"], False, _kubelet("v1.30.4+k3s1"), id="k3s-kubelet"),
        # EKS Distro (EKS Anywhere): self-managed, its kubelet's version is not EKS's
        pytest.param({"pool": "a"}, "auto", ["all"], False, _kubelet("v1.27.1-eks-1-27-4"), id="eks-distro"),
        pytest.param({"pool": "a"}, "auto", ["all"], True, _kubelet("v1.30.5-gke.1014001"), id="gke-kubelet"),
        pytest.param({"pool": "a"}, "auto", ["gke"], True, {}, id="providers-named"),
        pytest.param({"pool": "a"}, "auto", ["ovh"], False, {}, id="providers-without-the-plugin"),
        pytest.param({"pool": "a"}, "auto", [], False, {}, id="no-providers"),
        pytest.param({"pool": "a"}, "on", ["all"], True, {}, id="on"),
        pytest.param({"cloud.google.com/gke-nodepool": "a"}, "off", ["all"], False, {}, id="off"),
    ],
)
def test_extended_resource_toleration_is_taken_on_where_a_cloud_shows(
    labels: dict[str, str], setting: str, providers: list[str], plugin: bool, extra: dict[str, Any]
) -> None:
    """Taken on for a k3s cluster, a pod was steered to nodes whose nvidia.com/gpu taint it does not tolerate, and
    stayed Pending (found by a review of the cluster model)."""
    settings = Settings(cluster=ClusterSettings(extended_resource_toleration=setting, providers=providers))  # type: ignore[arg-type]
    tainted = node("t", labels, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    for part, fields in extra.items():
        tainted[part].update(fields)
    view = build_view([tainted], settings)
    assert view.extended_resource_toleration is plugin
    assert f"ExtendedResourceToleration: {'on' if plugin else 'off'}" in format_pools(view)
    assert bool(view.eligible(GPU_LIMIT)) is plugin


def test_extended_resource_toleration_reads_true_and_false_as_before(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  extendedResourceToleration: false\n")
    assert load_settings(path, environ={}).cluster.extended_resource_toleration == "off"
    path.write_text("cluster:\n  extendedResourceToleration: true\n")
    assert load_settings(path, environ={}).cluster.extended_resource_toleration == "on"


# ---------------------------------------------------------------------------------------------------------------
# Requests


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {
                "containers": [
                    {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                ]
            },
            {"nvidia.com/gpu": 3},
            id="sum-of-containers",
        ),
        pytest.param(
            {
                "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}],
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            {"nvidia.com/gpu": 4},
            id="largest-init",
        ),
        pytest.param(
            {
                "initContainers": [
                    {"restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                ],
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            {"nvidia.com/gpu": 3},
            id="init-after-sidecar-adds-it",
        ),
        pytest.param(
            {
                "initContainers": [
                    {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                    {"restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                ],
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            {"nvidia.com/gpu": 2},
            id="init-before-sidecar",
        ),
        pytest.param(
            {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}}]},
            {"nvidia.com/gpu": 2},
            id="limits-win",
        ),
        pytest.param(
            {
                "containers": [
                    {
                        "resources": {
                            "limits": {
                                "cpu": "2",
                                "example.kubernetes.io/x": "1",
                                "requests.nvidia.com/gpu": "1",
                                "nvidia.com/gpu": "lots",
                            }
                        }
                    }
                ]
            },
            {},
            id="not-extended-or-not-quantities",
        ),
        pytest.param({"containers": "x"}, {}, id="garbage"),
    ],
)
def test_requested_resources(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert requested_resources(spec) == {k: Decimal(v) for k, v in expected.items()}


def test_container_resources_and_names() -> None:
    c = {"resources": {"requests": {"nvidia.com/gpu": "500m"}, "limits": {"gpu-admission.io/gpu-memory": "20Gi"}}}
    assert container_resources(c) == {
        "nvidia.com/gpu": Decimal("0.5"),
        "gpu-admission.io/gpu-memory": Decimal(20 * 2**30),
    }
    assert extended_resource_names({"containers": [c]}) == {"nvidia.com/gpu", "gpu-admission.io/gpu-memory"}


# ---------------------------------------------------------------------------------------------------------------
# Declared pools and per-group cost


def test_declared_pool_without_nodes_is_judged_on_its_labels() -> None:
    pool = PoolSettings(name="zero", node_selector={"pool": "zero"}, taints=[], driver_version="570.26")
    view = build_view([], Settings(cluster=ClusterSettings(pools=[pool])))
    assert [c.group.pool for c in view.eligible({"nodeSelector": {"pool": "zero"}})] == ["zero"]
    assert view.eligible({"nodeSelector": {"pool": "other"}}) == []
    assert view.eligible({"nodeName": "zero-1"}) == []
    assert view.eligible(affinity(fields=[expr("metadata.name", "In", "zero-1")])) == []


def test_a_declared_pool_without_nodes_holds_a_name_not_in() -> None:
    """The nodes it will get carry names of their own: a rule that keeps the pod off one node (NotIn) lets it on
    them, one that pins it to a node (In) does not (every field rule kept the pod off every pool at zero)."""
    pool = PoolSettings(name="zero", node_selector={"pool": "zero"}, driver_version="570.26")
    view = build_view([node("a1", {"pool": "a"})], Settings(cluster=ClusterSettings(pools=[pool])))
    off_a1 = affinity(fields=[expr("metadata.name", "NotIn", "a1")])
    assert [(c.group.pool, c.nodes) for c in view.eligible(off_a1)] == [("zero", ())]
    off_gone = affinity(fields=[expr("metadata.name", "NotIn", "bad-1")])
    assert [(c.group.pool, c.nodes) for c in view.eligible(off_gone)] == [("gpu/driver-unknown", ("a1",)), ("zero", ())]
    to_zero = {"nodeSelector": {"pool": "zero"}, **off_gone}
    assert [(c.group.pool, c.nodes) for c in view.eligible(to_zero)] == [("zero", ())]
    on_a1 = affinity(fields=[expr("metadata.name", "In", "a1")])
    assert [(c.group.pool, c.nodes) for c in view.eligible(on_a1)] == [("gpu/driver-unknown", ("a1",))]


GKE_POOL, GKE_ACCELERATOR = "cloud.google.com/gke-nodepool", "cloud.google.com/gke-accelerator"
EKS_AT_ZERO = PoolSettings(name="gpu-new", node_selector={"eks.amazonaws.com/nodegroup": "gpu-new"})


def gke_at_zero(name: str, product: str, **kw: Any) -> PoolSettings:
    return PoolSettings(name=name, node_selector={GKE_POOL: name}, gpu_product=product, **kw)


@pytest.mark.parametrize(
    ("pool", "selector", "eligible"),
    [
        pytest.param(EKS_AT_ZERO, {"kubernetes.io/os": "linux"}, ["gpu-new"], id="os-linux"),
        pytest.param(EKS_AT_ZERO, {"beta.kubernetes.io/os": "linux"}, ["gpu-new"], id="beta-os-linux"),
        pytest.param(EKS_AT_ZERO, {"kubernetes.io/os": "windows"}, [], id="os-windows"),
        pytest.param(EKS_AT_ZERO, {"kubernetes.io/arch": "amd64"}, [], id="arch-not-known-not-guessed"),
        pytest.param(gke_at_zero("l4", "NVIDIA-L4"), {GKE_ACCELERATOR: "nvidia-l4"}, ["l4"], id="gke-l4"),
        pytest.param(gke_at_zero("l4", "NVIDIA-L4"), {GKE_ACCELERATOR: "nvidia-tesla-t4"}, [], id="gke-another-gpu"),
        pytest.param(gke_at_zero("l4", ""), {GKE_ACCELERATOR: "nvidia-l4"}, [], id="gke-no-product-not-guessed"),
        pytest.param(
            gke_at_zero("a100", "NVIDIA-A100-SXM4-40GB", mig_strategy="gke", mig_profiles={"1g.5gb": 7}),
            {GKE_ACCELERATOR: "nvidia-tesla-a100", "cloud.google.com/gke-gpu-partition-size": "1g.5gb"},
            ["a100"],
            id="gke-mig-as-its-docs-select",
        ),
        pytest.param(
            gke_at_zero("h100", "NVIDIA-H100-80GB-HBM3"),
            {GKE_ACCELERATOR: "nvidia-h100-80gb"},
            [],
            id="gke-h100-is-two",
        ),
        pytest.param(
            gke_at_zero("h100", "nvidia-h100-mega-80gb"),
            {GKE_ACCELERATOR: "nvidia-h100-mega-80gb"},
            ["h100"],
            id="gke-product-given-as-accelerator",
        ),
        pytest.param(
            PoolSettings(name="l4", node_selector={"pool": "l4"}, gpu_product="NVIDIA-L4"),
            {GKE_ACCELERATOR: "nvidia-l4"},
            [],
            id="selector-names-no-gke-pool",
        ),
    ],
)
def test_a_declared_pool_without_nodes_carries_the_labels_its_nodes_are_certain_to(
    pool: PoolSettings, selector: dict[str, str], eligible: list[str]
) -> None:
    """Judged on its nodeSelector's labels alone, it matched no pod that selects another (a Helm chart's
    kubernetes.io/os, GKE's documented accelerator label), and such a pod was refused where the pool ran its CUDA.
    What a declaration cannot know (the CPU architecture; a GPU GKE names two ways) is not guessed."""
    view = build_view([], Settings(cluster=ClusterSettings(pools=[pool])))
    assert [c.group.pool for c in view.eligible({"nodeSelector": selector})] == eligible


def test_groups_not_nodes() -> None:
    nodes = [node(f"n{i}", {"pool": f"p{i % 4}"}) for i in range(400)]
    view = build_view(nodes, Settings())
    assert len(view.groups) == 4
    candidates = view.eligible({"nodeSelector": {"pool": "p1"}})
    assert len(candidates) == 1 and len(candidates[0].nodes) == 100
    assert view.eligible({"nodeName": "n5"})[0].nodes == ("n5",)


@pytest.mark.parametrize("spec", [None, [], "pod", {"containers": None, "tolerations": {"a": 1}}])
def test_garbage_specs_never_crash(view: ClusterView, spec: Any) -> None:
    assert isinstance(view.eligible(spec), list)
    assert isinstance(requested_resources(spec), dict)
