"""The Helm chart, rendered by the real helm: lint, Kubernetes schema validation (1.30 to 1.34), safety properties.

Each value set in tests/chart_values/ is rendered once (cached) and shared by every test.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from certs import kube as certs_kube

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gpu-admission"
VALUES = Path(__file__).resolve().parent / "chart_values"
NAMESPACE = "gpu-admission"
RELEASE = "r"
FULLNAME = "r-gpu-admission"
KUBERNETES_VERSIONS = ["1.30", "1.31", "1.32", "1.33", "1.34"]
VALUE_SETS = sorted(p.stem for p in VALUES.glob("*.yaml"))
# CRDs: no schema in kubernetes-validate; their fields are checked by hand below.
CRD_KINDS = {"ServiceMonitor", "Issuer", "Certificate"}
POD_SPEC_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "Pod": ("spec",),
}


def helm_binary() -> str:
    found = shutil.which("helm") or str(ROOT / ".tools" / "helm")
    if not Path(found).exists():
        pytest.skip("helm not installed (make tools)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


class StrictLoader(yaml.SafeLoader):
    """YAML as kustomize and Argo CD read it: a mapping with a key twice is an error (PyYAML and helm keep the
    last; kustomize refuses the file: 'mapping key ... already defined')."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        twice = sorted({str(k) for k in keys if keys.count(k) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(
                None, None, f"keys given twice: {', '.join(twice)}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def template(*args: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The rendered objects, read strictly (every test's rendering is checked for keys given twice)."""
    proc = helm("template", RELEASE, str(CHART), "-n", namespace, *args)
    return [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]


@functools.cache
def _render(name: str) -> str:
    return json.dumps(template("-f", str(VALUES / f"{name}.yaml")))


def render_values(name: str) -> list[dict[str, Any]]:
    """The objects rendered for value set ``name`` (a fresh copy: tests may not share mutations)."""
    objects: list[dict[str, Any]] = json.loads(_render(name))
    return objects


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def find_all(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def dig(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def hooks(obj: dict[str, Any]) -> set[str]:
    value = obj["metadata"].get("annotations", {}).get("helm.sh/hook", "")
    return {h for h in value.split(",") if h}


def certs_jobs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Jobs of the certs tool (selfSigned mode), not the config check every mode has."""
    return [j for j in find_all(objects, "Job") if j["metadata"]["labels"]["app.kubernetes.io/component"] == "certs"]


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", dig(o, *POD_SPEC_PATHS[o["kind"]]))
        for o in objects
        if o["kind"] in POD_SPEC_PATHS
    ]


def webhooks(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(objects, kind)["webhooks"]:
            # pod updates only, each of its own: their tests are in test_chart_cel.py
            if hook["name"] not in ("protect-annotations.gpu-admission.io", "ungate.gpu-admission.io"):
                out.append((kind, hook))
    return out


@pytest.fixture(scope="module", params=VALUE_SETS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render_values(request.param)


# --- helm lint and Kubernetes schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint(name):
    proc = helm("lint", "--strict", str(CHART), "-n", NAMESPACE, "-f", str(VALUES / f"{name}.yaml"), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Helm 4's lint passes a render the chart refuses (a template's `fail`), logging it on stderr at INFO level.
    assert "funcMap fail" not in proc.stderr, proc.stderr


def test_kubernetes_validate_has_the_supported_versions():
    from kubernetes_validate import utils

    available = {utils.major_minor(v) for v in utils.all_versions()}
    assert set(KUBERNETES_VERSIONS) <= available


@pytest.fixture(scope="module")
def validate() -> Any:
    """kubernetes_validate.validate, with its schema files parsed once (it re-reads megabytes of JSON per call) and
    each distinct object validated once per version (most objects are the same in every value set)."""
    from kubernetes_validate import utils

    original = utils.schema_contents
    utils.schema_contents = functools.cache(original)

    @functools.cache
    def check(obj_json: str, version: str) -> str:
        try:
            kubernetes_validate.validate(json.loads(obj_json), version, strict=True)
        except kubernetes_validate.ValidationError as err:
            return f"{'.'.join(str(p) for p in err.path)}: {err.message}"
        return ""

    yield check
    utils.schema_contents = original


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates(rendered, version, validate):
    _, objects = rendered
    checked = 0
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        error = validate(json.dumps(obj, sort_keys=True), version)
        assert not error, f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: {error}"
        checked += 1
    assert checked >= 10


def test_crds_have_their_required_fields(rendered):
    _, objects = rendered
    for obj in objects:
        if obj["kind"] == "Certificate":
            assert obj["apiVersion"] == "cert-manager.io/v1"
            assert obj["spec"]["secretName"] and obj["spec"]["issuerRef"]["name"]
            if not obj["spec"].get("isCA"):  # the chart's own CA (test_chart_certmanager.py) serves nothing
                assert f"{FULLNAME}.{NAMESPACE}.svc" in obj["spec"]["dnsNames"]
        elif obj["kind"] == "Issuer":
            assert obj["apiVersion"] == "cert-manager.io/v1"
            assert obj["spec"] in ({"selfSigned": {}}, {"ca": {"secretName": f"{FULLNAME}-ca"}})
        elif obj["kind"] == "ServiceMonitor":
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            (endpoint,) = obj["spec"]["endpoints"]
            assert endpoint["port"] == "metrics"


# --- webhook configurations -------------------------------------------------------------------------------------


def test_webhook_configurations_are_release_resources_so_uninstall_removes_them(rendered):
    _, objects = rendered
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        obj = find(objects, kind)
        assert hooks(obj) == set(), f"{kind} is a hook: helm uninstall would leave it behind"
        assert "helm.sh/resource-policy" not in obj["metadata"].get("annotations", {})


def test_webhook_safety_fields(rendered):
    name, objects = rendered
    for kind, hook in webhooks(objects):
        assert hook["name"].endswith(".gpu-admission.io") and hook["name"].count(".") >= 2
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert 1 <= hook["timeoutSeconds"] <= 5, "a slow webhook holds every GPU pod create"
        assert hook["failurePolicy"] == ("Ignore" if name == "ha-off" else "Fail")
        assert hook["matchPolicy"] == "Equivalent"
        if kind == "MutatingWebhookConfiguration":
            assert hook["reinvocationPolicy"] == "IfNeeded"
        assert [c["name"] for c in hook["matchConditions"]] == [
            "gpu-related",
            "template-changed-on-update",
            "not-a-deployments-replicaset",
        ]


def test_webhook_rules(rendered):
    _, objects = rendered
    expected = {
        ("", "pods"): ["CREATE"],
        **{("apps", r): ["CREATE", "UPDATE"] for r in ("deployments", "statefulsets", "daemonsets", "replicasets")},
        # A Job's template is immutable: UPDATE is never sent (a patch would make the apiserver reject it).
        ("batch", "jobs"): ["CREATE"],
        ("batch", "cronjobs"): ["CREATE", "UPDATE"],
    }
    for _, hook in webhooks(objects):
        seen = {}
        for rule in hook["rules"]:
            assert rule["apiVersions"] == ["v1"] and rule["scope"] == "Namespaced"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    assert "*" not in resource and "/" not in resource
                    seen[(group, resource)] = rule["operations"]
        assert seen == expected


def test_workloads_can_be_left_out():
    for _, hook in webhooks(template("--set", "webhook.workloads=false")):
        assert hook["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert [c["name"] for c in hook["matchConditions"]] == ["gpu-related"]


@pytest.mark.parametrize("namespace", ["gpu-system", "platform"])
def test_namespace_selector_excludes_release_and_system_namespaces(namespace):
    objects = template(namespace=namespace)
    for _, hook in webhooks(objects):
        exprs = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
        by_name = exprs["kubernetes.io/metadata.name"]
        assert by_name["operator"] == "NotIn"
        assert {namespace, "kube-system", "kube-node-lease"} <= set(by_name["values"])
        assert exprs["gpu-admission.io/ignore"] == {
            "key": "gpu-admission.io/ignore",
            "operator": "NotIn",
            "values": ["true"],
        }
        # AKS's own namespaces, which its Admissions Enforcer would otherwise add (test below)
        assert exprs["kubernetes.azure.com/managedby"] == {
            "key": "kubernetes.azure.com/managedby",
            "operator": "NotIn",
            "values": ["aks"],
        }


@pytest.mark.parametrize("name", ["defaults", "all-on", "cert-manager"])
def test_both_webhook_configurations_opt_out_of_the_aks_admissions_enforcer(name):
    """AKS rewrote the selectors of a webhook without the annotation, and its field manager then owned them: with
    Helm 4's server-side apply the next `helm upgrade` failed ("conflicts with "admissionsenforcer"",
    Azure/AKS#4002). The chart's own selector leaves out what the enforcer would."""
    objects = render_values(name)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert find(objects, kind)["metadata"]["annotations"]["admissions.enforcer/disabled"] == "true"


@pytest.mark.parametrize("name", ["defaults", "all-on"])
def test_the_protecting_webhook_leaves_the_same_namespaces_alone(name):
    """A namespace labelled gpu-admission.io/ignore=true was left alone by the reviewing webhooks but not by the
    one that protects the webhook's annotations: its pods' annotation updates still waited on the webhook (refused
    under failurePolicy Fail while it was down)."""
    objects = render_values(name)
    (protect,) = [
        h
        for h in find(objects, "MutatingWebhookConfiguration")["webhooks"]
        if h["name"] == "protect-annotations.gpu-admission.io"
    ]
    for _, hook in webhooks(objects):
        assert protect["namespaceSelector"] == hook["namespaceSelector"]


def test_excluded_namespaces_follow_settings_exemptions():
    objects = render_values("all-on")
    for _, hook in webhooks(objects):
        (by_name,) = [
            e for e in hook["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"
        ]
        assert "monitoring" in by_name["values"]
        assert len(by_name["values"]) == len(set(by_name["values"]))


@pytest.mark.parametrize(("name", "present"), [("defaults", False), ("all-on", True)])
def test_object_selector_opt_out_follows_the_servers_setting(name, present):
    # One fact, one place: config.exemptions.allowOptOutLabel decides for the server and the apiserver alike.
    for _, hook in webhooks(render_values(name)):
        if present:
            assert hook["objectSelector"]["matchExpressions"] == [
                {"key": "gpu-admission.io/ignore", "operator": "NotIn", "values": ["true"]}
            ]
        else:
            assert "objectSelector" not in hook


def test_webhooks_call_the_service(rendered):
    _, objects = rendered
    service = find(objects, "Service")
    https = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    assert https["port"] == 443 and https["targetPort"] == "https"
    for kind, hook in webhooks(objects):
        svc = hook["clientConfig"]["service"]
        assert (svc["name"], svc["namespace"], svc["port"]) == (service["metadata"]["name"], NAMESPACE, 443)
        assert svc["path"] == ("/mutate" if kind.startswith("Mutating") else "/validate")


@pytest.mark.parametrize(
    ("name", "ca"),
    [
        pytest.param("defaults", "job", id="self-signed-job-injects"),
        pytest.param("cert-manager", "cert-manager", id="cert-manager-injects"),
        pytest.param("cert-manager-issuer", "cert-manager", id="cert-manager-own-issuer"),
        pytest.param("provided", "values", id="provided-bundle"),
    ],
)
def test_ca_bundle_per_cert_mode(name, ca):
    objects = render_values(name)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        obj = find(objects, kind)
        annotations = obj["metadata"].get("annotations", {})
        bundles = [h["clientConfig"].get("caBundle") for h in obj["webhooks"]]
        if ca == "values":
            assert all(b and b.startswith("LS0t") for b in bundles)
        else:
            # Helm must never own the field, or an upgrade would blank the injected CA.
            assert bundles == [None] * len(bundles)
        if ca == "cert-manager":
            assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{FULLNAME}"
            serving = [c for c in find_all(objects, "Certificate") if not c["spec"].get("isCA")]
            assert [c["metadata"]["name"] for c in serving] == [FULLNAME]
        else:
            assert "cert-manager.io/inject-ca-from" not in annotations
    kinds = {o["kind"] for o in objects}
    assert ("Issuer" in kinds) == (name == "cert-manager")
    assert ("Certificate" in kinds) == (ca == "cert-manager")


# --- certificates -----------------------------------------------------------------------------------------------


def _tls_secret(objects: list[dict[str, Any]]) -> str:
    deployment = find(objects, "Deployment")
    (volume,) = [v for v in dig(deployment, "spec", "template", "spec", "volumes") if v["name"] == "tls"]
    return str(volume["secret"]["secretName"])


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_certs_ensure_line_in_the_docs_counts_the_charts_webhooks():
    """Found by a review: docs/certificates.md showed the ValidatingWebhookConfiguration as '(1 webhook)', where the
    chart has two there (validate. and ungate.)."""
    proc = helm("template", "gpu-admission", str(CHART), "-n", "gpu-admission")
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    docs = " ".join((ROOT / "docs" / "certificates.md").read_text().split())
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = find(objects, kind)
        said = certs_kube.ConfigResult(kind, config["metadata"]["name"], webhooks=len(config["webhooks"])).text()
        assert said in docs, said


def test_self_signed_job_runs_certs_ensure_after_the_webhook_configurations_exist():
    objects = render_values("defaults")
    jobs = {tuple(sorted(hooks(j))): j for j in find_all(objects, "Job")}
    job = jobs[("post-install", "post-rollback", "post-upgrade")]
    assert "before-hook-creation" in job["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["certs", "ensure"]
    assert _arg(args, "--namespace") == NAMESPACE
    assert _arg(args, "--service") == find(objects, "Service")["metadata"]["name"]
    assert _arg(args, "--secret") == _tls_secret(objects)
    assert _arg(args, "--mutating-config") == find(objects, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert _arg(args, "--validating-config") == find(objects, "ValidatingWebhookConfiguration")["metadata"]["name"]
    assert int(_arg(args, "--days")) > int(_arg(args, "--renew-within-days"))
    # The ServiceAccount it runs as is a regular resource: it exists before post-install hooks run.
    sa = find(objects, "ServiceAccount", job["spec"]["template"]["spec"]["serviceAccountName"])
    assert hooks(sa) == set()


def test_self_signed_renewal_cron_job_runs_the_same_command():
    objects = render_values("defaults")
    cron = find(objects, "CronJob")
    job = next(j for j in find_all(objects, "Job") if "post-install" in hooks(j))
    assert (
        dig(cron, "spec", "jobTemplate", "spec", "template", "spec", "containers")[0]["args"]
        == (job["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    no_cron = template("--set", "certs.selfSigned.renewSchedule=")
    assert find_all(no_cron, "CronJob") == []


def _cleanup_job(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (cleanup,) = [j for j in find_all(objects, "Job") if hooks(j) == {"pre-delete"}]
    return cleanup


def test_uninstall_deletes_the_secret_the_job_made():
    objects = render_values("defaults")
    (container,) = _cleanup_job(objects)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SECRET"] == _tls_secret(objects) and env["NAMESPACE"] == NAMESPACE
    compile(container["args"][0], "cleanup", "exec")


def _job_deadlines(objects: list[dict[str, Any]]) -> list[int]:
    """The activeDeadlineSeconds of every Job, the CronJob's included."""
    job_specs = [j["spec"] for j in find_all(objects, "Job")]
    job_specs += [c["spec"]["jobTemplate"]["spec"] for c in find_all(objects, "CronJob")]
    return [spec["activeDeadlineSeconds"] for spec in job_specs]


def _notes(*args: str) -> str:
    return helm("install", RELEASE, str(CHART), "--dry-run=client", "-n", NAMESPACE, *args).stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize(
    ("args", "image"),
    [
        pytest.param([], "ghcr.io/gpu-admission/gpu-admission:0.1.0", id="default"),
        pytest.param(
            ["--set", "image.repository=registry.example.com/gpu-admission", "--set", "image.tag=0.2.0"],
            "registry.example.com/gpu-admission:0.2.0",
            id="tag",
        ),
        pytest.param(
            ["--set", "image.digest=sha256:" + "0123456789abcdef" * 4],
            "ghcr.io/gpu-admission/gpu-admission@sha256:" + "0123456789abcdef" * 4,
            id="digest",
        ),
    ],
)
def test_the_notes_name_the_image_installed(args, image):
    """The NOTES said 'gpu-admission 0.1.0 is installed' (the chart's appVersion) whatever image.tag the install gave
    (docs/install.md gives one): they name the image the pods run."""
    first = _notes(*args).strip().splitlines()[0]
    assert first == f"gpu-admission is installed in namespace {NAMESPACE}, running {image}.", first


def test_every_job_has_the_time_a_node_from_zero_takes(rendered):
    """One deadline for every Job, retries included: the uninstall's cleanup Job had 120 s, too short for a node to
    be made where it may run (a pool scaled to zero), where the other Jobs had 300 s (a review's finding)."""
    name, objects = rendered
    given = yaml.safe_load((VALUES / f"{name}.yaml").read_text()) or {}
    deadlines = _job_deadlines(objects)
    assert len(deadlines) >= (5 if name == "defaults" else 1)  # config check, certs-pre, certs, cleanup, renewal
    assert set(deadlines) == {given.get("jobDeadlineSeconds", 300)}, name


def test_the_job_deadline_can_be_raised_and_the_timeout_the_notes_give_follows_it(tmp_path: Path) -> None:
    """Nodes made from zero can take longer than 300 s (a large VM, a provider slow to find capacity); the deadline
    was fixed there (a review's finding). jobDeadlineSeconds sets every Job's, the NOTES give twice it as --timeout,
    and the schema refuses one too short for a pod to be scheduled and its image pulled."""
    assert set(_job_deadlines(template("--set", "jobDeadlineSeconds=900"))) == {900}
    notes = _notes("--set", "jobDeadlineSeconds=900")
    assert "each given 900 s to finish (jobDeadlineSeconds): pass --timeout 30m" in notes
    assert "pass --timeout 11m" in _notes("--set", "jobDeadlineSeconds=301")
    assert "helm's 5 minutes would give up" in notes
    assert "helm's 5 minutes" not in _notes("--set", "jobDeadlineSeconds=60")  # --timeout 2m: longer than no default
    for too_short_or_long in ("30", "86401", "12345678901234567890"):  # the last rendered a negative deadline
        values = tmp_path / f"deadline-{too_short_or_long}.yaml"
        values.write_text(f"jobDeadlineSeconds: {too_short_or_long}\n")
        proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values), check=False)
        assert proc.returncode != 0 and "jobDeadlineSeconds" in proc.stderr, too_short_or_long


def test_the_timeout_the_docs_give_outlasts_every_job_and_their_sum_is_as_said():
    """Helm waits for each hook Job up to --timeout (5m by default), the Jobs' own deadline: where their pods waited
    for a node made from zero, helm gave up with them or just before they finished, and with Helm 4 a failed hook
    is only reported once --timeout has passed (helm/helm#31690). The docs give a --timeout that leaves each Job's
    own outcome to decide (twice its deadline), the deadline and the sum of an install's Jobs as the chart has them."""
    objects = render_values("defaults")
    (deadline,) = {j["spec"]["activeDeadlineSeconds"] for j in find_all(objects, "Job")}
    install_jobs = [j for j in find_all(objects, "Job") if hooks(j) & {"pre-install", "post-install"}]
    assert len(install_jobs) == 3  # the config check, certs-pre, certs
    readme, install = ((ROOT / path).read_text() for path in ("README.md", "docs/install.md"))
    notes = _notes()
    for where, text in (("README.md", readme), ("docs/install.md", install), ("NOTES", notes)):
        minutes = [int(m) for m in re.findall(r"--timeout (\d+)m\b", text)]
        assert minutes and all(m * 60 >= 2 * deadline for m in minutes), (where, minutes)
        assert f"{deadline} s" in text, where
    assert f"up to {len(install_jobs) * deadline // 60} minutes in all" in install


# The helm commands and the hooks each runs.
HELM_COMMAND_HOOKS = {
    "install": {"pre-install", "post-install"},
    "upgrade": {"pre-upgrade", "post-upgrade"},
    "rollback": {"pre-rollback", "post-rollback"},
    "uninstall": {"pre-delete", "post-delete"},
}


def test_every_helm_command_that_runs_a_job_is_given_the_timeout():
    """The --timeout advice missed `helm rollback` (the certs Job is post-rollback too) and the incident steps of
    docs/operations.md: `helm upgrade --set webhook.failurePolicy=Ignore` runs the pre-upgrade hooks first, which
    with Helm 4 hold it the whole --timeout when one fails, and `helm uninstall` its pre-delete Job (a review's
    finding). The docs and the NOTES name every command whose hooks run a Job of the chart, and each such command
    the docs give to run carries --timeout (twice the Jobs' deadline) or --no-hooks."""
    objects = render_values("defaults")
    (deadline,) = set(_job_deadlines(objects))
    job_hooks = set().union(*(hooks(j) for j in find_all(objects, "Job")))
    running = {command for command, phases in HELM_COMMAND_HOOKS.items() if phases & job_hooks}
    assert running == set(HELM_COMMAND_HOOKS)
    install = " ".join((ROOT / "docs" / "install.md").read_text().split())
    advice = re.search(r"Give `--timeout \d+m` to (.*?) alike\.", install)
    assert advice and all(f"`helm {command}`" in advice.group(1) for command in running), "docs/install.md"
    (notes,) = [line for line in _notes().splitlines() if "the chart's Jobs too" in line]
    assert all(f"helm {command}" in notes for command in running - {"install"}), notes
    for path in ("docs/install.md", "docs/operations.md", "docs/certificates.md"):
        spans = re.findall(r"`(helm (?:upgrade|rollback|uninstall)\b[^`]*)`", (ROOT / path).read_text())
        to_run = [span for span in spans if any(not word.startswith("-") for word in span.split()[2:])]
        assert to_run or path == "docs/install.md", path
        for span in to_run:
            minutes = [int(m) for m in re.findall(r"--timeout (\d+)m\b", span)]
            assert "--no-hooks" in span or (minutes and all(m * 60 >= 2 * deadline for m in minutes)), (path, span)


SET_FLAGS = ("--set", "--set-string", "--set-json")


def _helm_values_in(text: str) -> list[tuple[str, list[str]]]:
    """The values each helm command of a Markdown ``text`` gives, as (command, its --set, --set-string and
    --set-json flags): a code block's helm install, upgrade and template (indented in a list item or not, after a
    `$ ` prompt or not, its backslash continuations joined) and each inline span that gives --set, read as a shell
    reads them. A command giving none is left out: a values file (-f my-values.yaml) is the user's own."""
    blocks = [
        re.sub(r"^[ \t]*(?:\$ )?", "", block, flags=re.M)
        for block in re.findall(r"^[ \t]*```[\w-]*\n(.*?)^[ \t]*```", text, re.S | re.M)
    ]
    commands = [
        " ".join(command.replace("\\\n", " ").split())
        for block in blocks
        for command in re.findall(r"^helm (?:install|upgrade|template)\b(?:[^\n]*\\\n)*[^\n]*", block, re.M)
    ]
    spans = [
        " ".join(s.split()) for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    ]
    commands += [span for span in spans if re.search(r"--set(-string|-json)?[ =]\S", span)]
    found = []
    for command in commands:
        words = [
            part
            for word in shlex.split(command.split(" | ")[0])
            for part in (word.split("=", 1) if word.split("=", 1)[0] in SET_FLAGS else [word])  # --set=key=value
        ]
        flags = [word for flag, value in itertools.pairwise(words) if flag in SET_FLAGS for word in (flag, value)]
        if flags:
            found.append((command, flags))
    return found


def _documented_helm_values() -> list[tuple[str, str, list[str]]]:
    """The values each helm command of README.md and docs/ gives, as (file, command, flags): _helm_values_in."""
    return [
        (str(path.relative_to(ROOT)), command, flags)
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for command, flags in _helm_values_in(path.read_text())
    ]


# Values the docs give as ones the chart refuses, saying why.
SAID_TO_BE_REFUSED = [["--set", "podLabels.spot=true"]]


def test_every_helm_command_in_the_docs_renders_as_written():
    """docs/install.md's `--set registryCA.configMapName=registry-ca` failed to render ("is for the registry reader:
    set config.cuda.registry.enabled: true too"), and its IRSA role annotation, typed in a shell, lost the
    backslashes that keep eks.amazonaws.com one key, which the schema refused (found by a review). Each command's
    values render with the real helm; those the docs say the chart refuses are refused."""
    documented = _documented_helm_values()
    assert SAID_TO_BE_REFUSED[0] in [flags for _, _, flags in documented]  # the commands are found at all
    wrong = []
    for path, command, flags in documented:
        proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *flags, check=False)
        if (proc.returncode != 0) != (flags in SAID_TO_BE_REFUSED):
            wrong.append(f"{path}: {command}\n  {proc.stderr.strip() or 'renders: the docs say the chart refuses it'}")
    assert not wrong, "\n".join(wrong)


DOCUMENTED = """
1. Install:

   ```bash
   helm install x charts/gpu-admission \\
     --set config.cuda.mode=warn
   ```

```console
$ helm upgrade x charts/gpu-admission --set-string podLabels.team=0123
```

```bash
helm install x charts/gpu-admission -n gpu-admission
```

To warn instead: `--set=config.cuda.mode=warn`, or `--set-json 'config.cuda={"mode": "warn"}'`.
"""


def test_the_helm_commands_of_the_docs_are_found_however_they_are_written():
    """A code block indented in a list item, a `$ ` prompt (```console), `--set=key=value` went unread, and a
    count floor of 8 let one more command's refusal through; a code block's helm install with no values failed
    the test (a review's)."""
    assert _helm_values_in(DOCUMENTED) == [
        ("helm install x charts/gpu-admission --set config.cuda.mode=warn", ["--set", "config.cuda.mode=warn"]),
        (
            "helm upgrade x charts/gpu-admission --set-string podLabels.team=0123",
            ["--set-string", "podLabels.team=0123"],
        ),
        ("--set=config.cuda.mode=warn", ["--set", "config.cuda.mode=warn"]),
        ('--set-json \'config.cuda={"mode": "warn"}\'', ["--set-json", 'config.cuda={"mode": "warn"}']),
    ]


# The labels `gpu-admission certs ensure` puts on the Secret it makes, which the cleanup Job looks for.
CERTS_LABELS = dict(certs_kube.LABELS)


@pytest.mark.parametrize(
    ("labels", "replaced", "deleted"),
    [
        pytest.param(CERTS_LABELS, False, True, id="made-by-certs-tool"),
        pytest.param({}, False, False, id="users-own-secret-of-that-name"),
        pytest.param({**CERTS_LABELS, "app.kubernetes.io/name": "other"}, False, False, id="other-app"),
        pytest.param(CERTS_LABELS, True, False, id="replaced-between-read-and-delete"),
    ],
)
def test_cleanup_job_deletes_only_the_secret_the_certs_tool_made(tmp_path, monkeypatch, labels, replaced, deleted):
    """The cleanup script as rendered, run against the in-memory API server."""
    from kubernetes import client, config

    from tests.kubeapi import KubeAPI

    objects = render_values("defaults")
    (container,) = _cleanup_job(objects)["spec"]["template"]["spec"]["containers"]
    for env in container["env"]:
        monkeypatch.setenv(env["name"], env["value"])
    secret = _tls_secret(objects)
    api = KubeAPI().start()
    try:
        api.put("v1", "secrets", {"metadata": {"name": secret, "labels": labels}, "data": {}}, namespace=NAMESPACE)
        kubeconfig = api.kubeconfig(str(tmp_path / "kubeconfig"))

        # In the pod it reads the ServiceAccount's in-cluster config; here, the test server's.
        def test_server_config() -> None:
            config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]

        monkeypatch.setattr(config, "load_incluster_config", test_server_config)
        if replaced:  # another Secret of that name (a new uid) appears after the cleanup read the old one
            read = client.CoreV1Api.read_namespaced_secret

            def read_then_replace(self: Any, name: str, namespace: str, **kw: Any) -> Any:
                found = read(self, name, namespace, **kw)
                api.delete("v1", "secrets", name, namespace)
                api.put("v1", "secrets", {"metadata": {"name": name, "labels": labels}}, namespace=namespace)
                return found

            monkeypatch.setattr(client.CoreV1Api, "read_namespaced_secret", read_then_replace)
        exec(compile(container["args"][0], "cleanup", "exec"), {"__name__": "__main__"})
        assert (api.get("v1", "secrets", secret, NAMESPACE) is None) == deleted
        # A second run (the Job retried, or the Secret already gone) does not fail.
        exec(compile(container["args"][0], "cleanup", "exec"), {"__name__": "__main__"})
    finally:
        api.stop()


@pytest.mark.parametrize(("value", "present"), [(None, True), ("true", True), ("false", False)])
def test_cleanup_hook_can_be_left_out_for_gitops(value, present):
    # Applied as a plain resource (helm template | kubectl apply, tools that apply hooks), the pre-delete Job would
    # delete the live Secret at once: certs.selfSigned.cleanupOnUninstall=false leaves it out.
    args = [] if value is None else ["--set", f"certs.selfSigned.cleanupOnUninstall={value}"]
    objects = template(*args)
    pre_delete = [o for o in objects if "pre-delete" in hooks(o)]
    assert len(pre_delete) == (1 if present else 0)
    # The rest of the self-signed machinery is unchanged.
    assert len(certs_jobs(objects)) == (3 if present else 2)
    assert find_all(objects, "CronJob")


@pytest.mark.parametrize("name", ["cert-manager", "provided"])
def test_no_certs_job_outside_self_signed(name):
    objects = render_values(name)
    assert [j["metadata"]["name"] for j in find_all(objects, "Job")] == [f"{FULLNAME}-config-check"]
    assert find_all(objects, "CronJob") == []


def test_provided_mode_mounts_the_users_secret():
    assert _tls_secret(render_values("provided")) == "my-webhook-tls"


# --- RBAC -------------------------------------------------------------------------------------------------------


def _rules(objects: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return list(find(objects, kind, name)["rules"])


def test_no_pod_is_given_the_variables_of_services():
    """Under the release name the docs use the Service is gpu-admission, whose variables the kubelet writes as
    GPU_ADMISSION_SERVICE_HOST and the like: the prefix of the server's settings variables (found by a review)."""
    proc = helm("template", "gpu-admission", str(CHART), "-n", NAMESPACE)
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    assert find(objects, "Service")["metadata"]["name"] == "gpu-admission"
    specs = pod_specs(objects)
    assert {where.split("/")[0] for where, _ in specs} >= {"Deployment", "Job", "CronJob", "Pod"}
    for where, spec in specs:
        assert spec.get("enableServiceLinks") is False, where


def test_server_rbac_is_minimal(rendered):
    _, objects = rendered
    rules = _rules(objects, "ClusterRole", FULLNAME)
    assert rules == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]},
    ]
    binding = find(objects, "ClusterRoleBinding", FULLNAME)
    deployment = find(objects, "Deployment")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": dig(deployment, "spec", "template", "spec", "serviceAccountName"),
            "namespace": NAMESPACE,
        }
    ]


def test_own_service_account_is_the_one_bound_and_run_as():
    objects = template("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=platform-webhook")
    spec, _ = _server(objects)
    assert spec["serviceAccountName"] == "platform-webhook"
    assert [s["name"] for s in find(objects, "ClusterRoleBinding", FULLNAME)["subjects"]] == ["platform-webhook"]
    assert "platform-webhook" not in {o["metadata"]["name"] for o in find_all(objects, "ServiceAccount")}


def test_certs_rbac_is_limited_by_resource_names():
    objects = render_values("defaults")
    secret = _tls_secret(objects)
    role = _rules(objects, "Role", f"{FULLNAME}-certs")
    assert role == [
        # create cannot be limited by resourceNames (Kubernetes does not know the name at authorization time).
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [secret],
            "verbs": ["get", "update", "patch", "delete"],
        },
    ]
    cluster = _rules(objects, "ClusterRole", f"{FULLNAME}-certs")
    assert cluster == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
            "resourceNames": [FULLNAME],
            "verbs": ["get", "patch"],
        }
    ]


def test_no_wildcards_in_any_rbac_rule(rendered):
    _, objects = rendered
    for obj in objects:
        if obj["kind"] in ("Role", "ClusterRole"):
            for rule in obj["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], f"{obj['kind']}/{obj['metadata']['name']} {field}"


# --- names ------------------------------------------------------------------------------------------------------

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# The longest name each kind takes: a Job's name becomes a label value of its pods (63); a CronJob's Jobs are named
# "<cronjob>-<minutes>" (52); Services and pods are DNS labels; the rest are held to 63 by the chart all the same.
NAME_LIMIT = {"CronJob": 52}
LONG = "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi"  # 53: helm's longest release name


@pytest.mark.parametrize(
    ("release", "args"),
    [
        pytest.param(LONG, [], id="53-chars"),
        pytest.param(LONG[:39] + "-gpu-admission", [], id="53-chars-with-the-chart-name"),
        pytest.param("r", ["--set", "fullnameOverride=" + LONG[:52]], id="52-char-fullname-override"),
    ],
)
@pytest.mark.parametrize("values", ["defaults", "all-on"])
@pytest.mark.parametrize("mode", ["selfSigned", "certManager"])
def test_long_release_names_give_valid_distinct_names(release, args, values, mode):
    values_file = str(VALUES / f"{values}.yaml")
    proc = helm(
        "template", release, str(CHART), "-n", NAMESPACE, "-f", values_file, "--set", f"certs.mode={mode}", *args
    )
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    seen: dict[str, list[str]] = {}
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        assert len(name) <= NAME_LIMIT.get(kind, 63) and DNS_LABEL.match(name), f"{kind} {name!r} ({len(name)})"
        seen.setdefault(kind, []).append(name)
        for key, value in obj["metadata"].get("labels", {}).items():
            assert len(value) <= 63 and LABEL_VALUE.match(value), f"{kind}/{name} label {key}={value!r}"
    for kind, names in seen.items():
        assert len(names) == len(set(names)), f"two {kind}s named alike: {sorted(names)}"
    # What refers to a name finds it: ServiceAccounts run as, RBAC bound, the certs tool's Service and Secret.
    accounts = set(seen["ServiceAccount"])
    for where, spec in pod_specs(objects):
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts, where
        else:  # the config check reads a file: the namespace's default ServiceAccount, with no token
            assert spec["automountServiceAccountToken"] is False, where
    for binding in find_all(objects, "RoleBinding") + find_all(objects, "ClusterRoleBinding"):
        role_kind = binding["roleRef"]["kind"]
        assert binding["roleRef"]["name"] in seen[role_kind], binding["metadata"]["name"]
        assert {s["name"] for s in binding["subjects"]} <= accounts, binding["metadata"]["name"]
    service = find(objects, "Service")["metadata"]["name"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert {h["clientConfig"]["service"]["name"] for h in find(objects, kind)["webhooks"]} == {service}
    secrets = [c["spec"]["secretName"] for c in find_all(objects, "Certificate")]
    assert len(secrets) == len(set(secrets)) and all(len(n) <= 63 for n in secrets), secrets
    for issuer in find_all(objects, "Issuer"):  # certManager: the CA Issuer's Secret is the CA Certificate's
        if "ca" in issuer["spec"]:
            assert issuer["spec"]["ca"]["secretName"] in [
                c["spec"]["secretName"] for c in find_all(objects, "Certificate")
            ]
    for job in find_all(objects, "Job"):
        args = job["spec"]["template"]["spec"]["containers"][0].get("args", [])
        if args[:2] == ["certs", "ensure"]:
            assert _arg(args, "--service") == service
            assert _arg(args, "--secret") == _tls_secret(objects)


@pytest.mark.parametrize(
    ("release", "args", "service"),
    [
        pytest.param("r", [], "r-gpu-admission", id="release-plus-chart-name"),
        pytest.param("gpu-admission", [], "gpu-admission", id="release-containing-the-chart-name"),
        pytest.param("team-gpu-admission", [], "team-gpu-admission", id="release-containing-it-elsewhere"),
        pytest.param("r", ["--set", "fullnameOverride=webhook"], "webhook", id="override"),
    ],
)
def test_service_and_secret_names_as_the_docs_give_them(release, args, service):
    # docs/install.md and docs/certificates.md: the Service (the name certificates must be valid for) is
    # <release>-gpu-admission, or <release> when it contains gpu-admission; the self-signed Secret <service>-tls.
    proc = helm("template", release, str(CHART), "-n", NAMESPACE, *args)
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    assert find(objects, "Service")["metadata"]["name"] == service
    assert _tls_secret(objects) == f"{service}-tls"


# --- the Deployment ---------------------------------------------------------------------------------------------


def test_every_pod_is_locked_down(rendered):
    _, objects = rendered
    specs = pod_specs(objects)
    assert len(specs) >= 2
    for where, spec in specs:
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for c in spec["containers"] + spec.get("initContainers", []):
            ctx = c["securityContext"]
            assert ctx["runAsNonRoot"] is True, where
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["capabilities"] == {"drop": ["ALL"]}, where
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert ctx["runAsUser"] > 0, where
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], where


@pytest.mark.parametrize("name", ["defaults", "all-on"])
def test_every_pod_is_scheduled_where_the_server_may_run(name):
    # On a cluster where only labelled or tainted nodes may run the webhook (or its image needs a pull secret), the
    # certs Jobs, the renewal CronJob, the cleanup Job and the helm test pod would otherwise hang Pending.
    objects = render_values(name)
    server, _ = _server(objects)
    fields = ("imagePullSecrets", "priorityClassName", "nodeSelector", "tolerations")
    one_shot = [(where, spec) for where, spec in pod_specs(objects) if not where.startswith("Deployment/")]
    assert len(one_shot) == 6  # config-check, certs-pre, certs, cleanup Jobs, the CronJob, the helm test pod
    for where, spec in one_shot:
        for field in fields:
            assert spec.get(field) == server.get(field), f"{where} {field}"
        # Which nodes, yes; how replicas spread against each other, no (one pod that runs once).
        assert spec.get("affinity") == (
            {"nodeAffinity": server["affinity"]["nodeAffinity"]} if "affinity" in server else None
        ), where
        assert "topologySpreadConstraints" not in spec, where
    if name == "all-on":
        assert server["nodeSelector"] and server["tolerations"] and server["imagePullSecrets"]
        assert set(server["affinity"]) == {"nodeAffinity", "podAntiAffinity"}


def _values_comment(key: str) -> str:
    """The comment of a key of values.yaml (dotted for a nested one, as `service.port`): the lines above it, past keys
    of its own group that have none."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    at = -1
    for depth, part in enumerate(key.split(".")):
        at = next(i for i in range(at + 1, len(lines)) if lines[i].startswith(f"{'  ' * depth}{part}:"))
    indent = "  " * key.count(".")
    comment: list[str] = []
    for line in reversed(lines[:at]):
        if line.startswith(f"{indent}#"):
            comment.insert(0, line.lstrip("# "))
        elif comment or not re.match(rf"{indent}[A-Za-z]+: ", line):
            break
    return " ".join(comment)


def test_values_say_that_the_scheduling_fields_apply_to_every_one_shot_pod():
    """values.yaml said imagePullSecrets and the scheduling fields reach the certs Jobs, the CronJob, the cleanup Job
    and the helm test pod, not the config check Job, which takes them too (imagePullSecrets said nothing): each
    field's comment names every one-shot pod the chart renders."""
    named = {
        "config-check": "config check Job",
        "certs": "certs Jobs",
        "certs-pre": "certs Jobs",
        "certs-renew": "renewal CronJob",
        "certs-cleanup": "cleanup Job",
        "test": "helm test pod",
    }
    objects = render_values("all-on")
    one_shot = {where.split("/")[1].removeprefix(f"{FULLNAME}-"): spec for where, spec in pod_specs(objects)}
    del one_shot[FULLNAME]
    assert one_shot.keys() == named.keys()
    for field in ("imagePullSecrets", "priorityClassName", "nodeSelector", "tolerations", "affinity"):
        comment = " ".join(_values_comment(field).split())
        for pod, spec in one_shot.items():
            assert field in spec, (field, pod)
            assert named[pod] in comment, f"values.yaml's comment on {field} leaves out the {named[pod]}"


def _pod_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The metadata of the pods an object makes (a Pod's own)."""
    meta: dict[str, Any] = dig(obj, *POD_SPEC_PATHS[obj["kind"]][:-1], "metadata")
    return meta


def test_every_one_shot_pod_takes_the_job_pod_labels_and_annotations_not_the_servers(rendered):
    """A service mesh's proxy injected into a Job's pod (a plain container that never exits) kept the Job running
    after its container ended, and `helm install` waited on the hook until its timeout; a policy engine may ask for
    labels. Every Job, the CronJob's and the helm test pod take jobPodLabels and jobPodAnnotations, injection off by
    default; the server's podLabels and podAnnotations (Prometheus, Vault ...) stay on the server's pods."""
    name, objects = rendered
    given = yaml.safe_load((VALUES / f"{name}.yaml").read_text()) or {}
    server = _pod_metadata(find(objects, "Deployment"))
    one_shot = [o for o in objects if o["kind"] in POD_SPEC_PATHS and o["kind"] != "Deployment"]
    assert {o["metadata"]["name"] for o in one_shot} >= {f"{FULLNAME}-config-check", f"{FULLNAME}-test"}
    for obj in one_shot:
        where, meta = f"{obj['kind']}/{obj['metadata']['name']}", _pod_metadata(obj)
        labels, annotations = meta["labels"], meta.get("annotations", {})
        for field, found in (("jobPodLabels", labels), ("jobPodAnnotations", annotations)):
            assert found.items() >= given.get(field, {}).items(), f"{where} {field}"
        assert labels["sidecar.istio.io/inject"] == "false" and annotations["linkerd.io/inject"] == "disabled", where
        assert labels["app.kubernetes.io/component"] == obj["metadata"]["labels"]["app.kubernetes.io/component"], where
        assert not labels.keys() & given.get("podLabels", {}).keys(), where
        assert not annotations.keys() & given.get("podAnnotations", {}).keys(), where
    assert "sidecar.istio.io/inject" not in server["labels"] and "linkerd.io/inject" not in server["annotations"]
    if name == "all-on":
        assert len(one_shot) == 6  # config-check, certs-pre, certs, cleanup Jobs, the CronJob, the helm test pod
        assert given["jobPodLabels"] and given["jobPodAnnotations"] and given["podLabels"] and given["podAnnotations"]
        assert server["labels"].items() >= given["podLabels"].items()


def _one_shot_pod_metadata(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    one_shot = [o for o in objects if o["kind"] in ("Job", "CronJob", "Pod")]
    assert len(one_shot) == 6  # config-check, certs-pre, certs, cleanup Jobs, the CronJob, the helm test pod
    return [_pod_metadata(o) for o in one_shot]


def test_a_mesh_that_must_inject_every_pod_can_drop_the_job_pods_opt_out():
    """A policy that requires every pod in the mesh refuses the opt-out: a key given null is dropped."""
    objects = template(
        "--set", "jobPodLabels.sidecar\\.istio\\.io/inject=null", "--set", "jobPodAnnotations.linkerd\\.io/inject=null"
    )
    for meta in _one_shot_pod_metadata(objects):
        assert "sidecar.istio.io/inject" not in meta["labels"] and "linkerd.io/inject" not in meta.get(
            "annotations", {}
        )
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_a_key_of_your_own_given_null_by_a_later_values_file_is_dropped(tmp_path):
    """Helm deletes a null key only where the chart's values.yaml has it: a key of the user's own from a base
    values file set null in an overlay reached the schema as null and failed the install (a review's finding)."""
    base, overlay = tmp_path / "base.yaml", tmp_path / "overlay.yaml"
    base.write_text(yaml.safe_dump({"jobPodLabels": {"example.com/a": "1", "example.com/b": "2"}}))
    overlay.write_text(yaml.safe_dump({"jobPodLabels": {"example.com/a": None}}))
    for meta in _one_shot_pod_metadata(template("-f", str(base), "-f", str(overlay))):
        assert "example.com/a" not in meta["labels"] and meta["labels"]["example.com/b"] == "2"
        assert meta["labels"]["sidecar.istio.io/inject"] == "false"


def test_a_server_pod_key_given_null_is_dropped_the_charts_safe_to_evict_default_included(tmp_path):
    """podLabels and podAnnotations refused null in the schema ('got null, want string'), where the jobPod* maps
    took it: an overlay could not drop a key a base values file gave, nor the chart's safe-to-evict-local-volumes."""
    base, overlay = tmp_path / "base.yaml", tmp_path / "overlay.yaml"
    given = {"example.com/a": "1", "example.com/b": "2"}
    base.write_text(yaml.safe_dump({"podLabels": given, "podAnnotations": given}))
    dropped = {"example.com/a": None}
    overlay.write_text(yaml.safe_dump({"podLabels": dropped, "podAnnotations": {**dropped, SAFE_TO_EVICT_LOCAL: None}}))
    server = _pod_metadata(find(template("-f", str(base), "-f", str(overlay)), "Deployment"))
    for found in (server["labels"], server["annotations"]):
        assert "example.com/a" not in found and found["example.com/b"] == "2", found
    assert SAFE_TO_EVICT_LOCAL not in server["annotations"]
    assert SAFE_TO_EVICT_LOCAL in _pod_metadata(find(template("-f", str(base)), "Deployment"))["annotations"]


def test_an_upgrade_reusing_the_values_of_a_release_made_before_the_job_pod_keys_keeps_the_opt_out(tmp_path):
    """`helm upgrade --reuse-values` renders with the values of the release it upgrades (Helm 4: chart.Values =
    oldVals), and one made before jobPodLabels and jobPodAnnotations existed has neither: kept in values.yaml, the
    opt-out was lost there, and in a mesh the pre-upgrade config check never completed (a review's finding). Here
    the chart renders with a values.yaml that lacks them, as such a release's; nor has it jobDeadlineSeconds, and
    the Jobs keep their deadline."""
    chart = tmp_path / "gpu-admission"
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    deadline = values.pop("jobDeadlineSeconds")
    del values["jobPodLabels"], values["jobPodAnnotations"]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    objects = [d for d in yaml.safe_load_all(helm("template", RELEASE, str(chart), "-n", NAMESPACE).stdout) if d]
    for meta in _one_shot_pod_metadata(objects):
        assert meta["labels"]["sidecar.istio.io/inject"] == "false", meta
        assert meta["annotations"]["linkerd.io/inject"] == "disabled", meta
    assert set(_job_deadlines(objects)) == {deadline}  # values.yaml's, not none at all


SAFE_TO_EVICT_LOCAL = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"


def _refused_keys(field: str, keys: set[str], *args: str) -> None:
    """Each key given in `field` fails the render, saying the chart writes it."""
    for key in keys:
        escaped = key.replace(".", "\\.")
        proc = helm(
            "template", RELEASE, str(CHART), "-n", NAMESPACE, *args, "--set", f"{field}.{escaped}=x", check=False
        )
        assert proc.returncode != 0 and f"{field}: {key} is set by the chart on " in proc.stderr, (field, key)


def _with_values_of_an_old_release(
    tmp_path: Path, *args: str, command: str = "template"
) -> subprocess.CompletedProcess[str]:
    """helm template as `helm upgrade --reuse-values` renders over a release of the chart as it was at 077b784 (the
    first whose values this schema takes): with that release's whole values, the chart's own values.yaml unread."""
    chart = tmp_path / "gpu-admission"
    shutil.copytree(CHART, chart)
    shutil.copy(ROOT / "tests" / "chart_reused" / "values-077b784.yaml", chart / "values.yaml")
    return helm(command, RELEASE, str(chart), "-n", NAMESPACE, *args, check=False)


REUSED = ROOT / "tests" / "chart_reused"
"""The whole values of releases of the chart as it was at a commit (values-<commit>.yaml): what `helm upgrade
--reuse-values` renders with over such a release (Helm: chart.Values = the old release's), the user's given on top."""


def _upgrade_over(tmp_path: Path, commit: str, given: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """A real `helm upgrade RELEASE CHART -n NAMESPACE *args --dry-run=client` over a release of the chart as it was
    at `commit`, made with the values `given`: the release is kept in helm's memory driver, and tests/kubeapi.py
    answers helm's question of the server's version."""
    from tests.kubeapi import KubeAPI

    release = {
        "name": RELEASE,
        "namespace": NAMESPACE,
        "version": 1,
        "info": {"status": "deployed"},
        "chart": {
            "metadata": {"apiVersion": "v2", "name": "gpu-admission", "version": "0.1.0"},
            "values": yaml.safe_load((REUSED / f"values-{commit}.yaml").read_text()),
        },
        "config": given,
        "manifest": "",
    }
    stored = tmp_path / "releases.yaml"
    stored.write_text(yaml.safe_dump([release]))
    api = KubeAPI().start()
    try:
        env = {
            **os.environ,
            "HELM_DRIVER": "memory",
            "HELM_MEMORY_DRIVER_DATA": str(stored),
            "KUBECONFIG": api.kubeconfig(str(tmp_path / "kubeconfig")),
        }
        command = [helm_binary(), "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *args, "--dry-run=client"]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        api.stop()


@pytest.mark.parametrize("commit", ["d7f9ccf", "20545ce"])
def test_an_upgrade_reusing_the_values_of_the_first_releases_says_what_to_do_with_object_opt_out(tmp_path, commit):
    """The first two releases' values hold webhook.objectOptOut, gone since: `helm upgrade --reuse-values` over one
    failed the schema ('at '/webhook': additional properties 'objectOptOut' not allowed'), saying nothing of what to
    do (a review's finding). The chart says it: upgrade with --reset-then-reuse-values, or drop the key; each works."""
    proc = _upgrade_over(tmp_path, commit, {}, "--reuse-values")
    assert proc.returncode != 0
    assert "webhook.objectOptOut (true) is no longer a setting" in proc.stderr, proc.stderr
    assert "Drop it: add --set webhook.objectOptOut=null to the upgrade" in proc.stderr
    assert "config.exemptions.allowOptOutLabel" in proc.stderr
    for way in (["--reset-then-reuse-values"], ["--reuse-values", "--set", "webhook.objectOptOut=null"]):
        proc = _upgrade_over(tmp_path, commit, {}, *way)
        assert proc.returncode == 0, (way, proc.stderr)


def test_an_upgrade_reusing_object_opt_out_given_to_a_first_release_says_to_drop_it(tmp_path):
    """Where the user gave webhook.objectOptOut to a first release (--set, or `helm show values > my.yaml`),
    --reset-then-reuse-values reuses it too: the chart said to upgrade with --reset-then-reuse-values, the very
    command that failed (a review's finding). It says to drop it with --set webhook.objectOptOut=null, which works."""
    given = {"webhook": {"objectOptOut": False}}
    proc = _upgrade_over(tmp_path, "d7f9ccf", given, "--reset-then-reuse-values")
    assert proc.returncode != 0
    assert "webhook.objectOptOut (false) is no longer a setting" in proc.stderr, proc.stderr
    assert "Drop it: add --set webhook.objectOptOut=null to the upgrade" in proc.stderr
    assert "upgrade with --reset-then-reuse-values" not in proc.stderr
    proc = _upgrade_over(tmp_path, "d7f9ccf", given, "--reset-then-reuse-values", "--set", "webhook.objectOptOut=null")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("commit", "given"),
    [
        pytest.param("077b784", {"certs": {"mode": "certManager"}}, id="cert-manager-before-its-ca"),
        pytest.param("d7f9ccf", {}, id="first-release"),
        pytest.param("d7f9ccf", {"webhook": {"objectOptOut": False}}, id="first-release-given-object-opt-out"),
        pytest.param("20545ce", {"webhook": {"objectOptOut": True}}, id="second-release-given-object-opt-out"),
    ],
)
def test_the_documented_way_to_admit_unchecked_upgrades_old_releases(tmp_path, commit, given):
    """docs/operations.md's way out, `helm upgrade ... --reuse-values --set webhook.failurePolicy=Ignore`, failed
    over a certManager release made before the chart issued its own CA ('certs.certManager.caDuration is missing'),
    in an outage, where the command must work (a review's finding); with --reset-then-reuse-values it still failed
    where the user's own values gave a first release webhook.objectOptOut (another review's finding). The command as
    the docs give it is run by helm over such releases, and sets every webhook to Ignore."""
    text = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    (recipe,) = re.findall(r"`helm upgrade <release> <chart> -n <namespace> ([^`]*failurePolicy=Ignore)`", text)
    proc = _upgrade_over(tmp_path, commit, given, *recipe.split())
    assert proc.returncode == 0, (recipe, proc.stderr)
    assert "failurePolicy: Ignore" in proc.stdout and "failurePolicy: Fail" not in proc.stdout


def test_an_upgrade_reusing_the_values_of_an_old_release_renders_what_kubernetes_takes(tmp_path, validate):
    """A release made before configCheck, registryCredentials, registryCA and threads existed, upgraded with
    --reuse-values (as docs/operations.md's way out does), failed to render: 'nil pointer evaluating interface
    {}.enabled' (configCheck), then registryCredentials.secretName; and threads would have been an empty --threads,
    which the server refuses. The config check runs, as values.yaml's default; nothing of the registry reader is
    mounted; the server takes its own thread count. The config check's pod has values.yaml's resources: it had none,
    and a namespace whose ResourceQuota requires them made no pod, and the upgrade failed at the Job's deadline."""
    proc = _with_values_of_an_old_release(tmp_path)
    assert proc.returncode == 0, proc.stderr
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    check = find(objects, "Job", f"{FULLNAME}-config-check")
    resources = yaml.safe_load((CHART / "values.yaml").read_text())["configCheck"]["resources"]
    assert dig(check, "spec", "template", "spec")["containers"][0]["resources"] == resources  # a ResourceQuota's
    server, container = _server(objects)
    assert "--threads" not in container["args"] and all(a != "" for a in container["args"])
    assert not {v["name"] for v in server["volumes"]} & {"registry-credentials", "registry-ca"}
    for obj in objects:
        error = validate(json.dumps(obj, sort_keys=True), KUBERNETES_VERSIONS[-1])
        assert not error, f"{obj['kind']}/{obj['metadata']['name']}: {error}"


def test_an_upgrade_reusing_the_values_of_an_old_release_keeps_the_cleanup_on_uninstall(tmp_path):
    """A release made before certs.selfSigned.cleanupOnUninstall ran the pre-delete cleanup Job always; upgraded with
    --reuse-values the missing value read false, the Job was left out, and `helm uninstall` left the TLS Secret (its
    private key). It is on, as values.yaml's default, and the NOTES count helm uninstall among the commands that run
    a Job; false given still leaves it out."""
    default = yaml.safe_load((CHART / "values.yaml").read_text())["certs"]["selfSigned"]["cleanupOnUninstall"]
    for given, expected in (([], default), (["--set", "certs.selfSigned.cleanupOnUninstall=false"], False)):
        proc = _with_values_of_an_old_release(tmp_path / f"template{len(given)}", *given)
        assert proc.returncode == 0, proc.stderr
        objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
        assert bool([o for o in objects if o["kind"] == "Job" and "pre-delete" in hooks(o)]) is expected, given
        install = _with_values_of_an_old_release(
            tmp_path / f"install{len(given)}", "--dry-run=client", *given, command="install"
        )
        assert install.returncode == 0, install.stderr
        assert ("and helm uninstall run the chart's Jobs" in install.stdout.split("NOTES:", 1)[1]) is expected, given


def test_an_upgrade_reusing_the_values_of_an_old_release_mounts_the_registry_ca_given_under_its_default_key(
    tmp_path, validate
):
    """--reuse-values over a release made before registryCA, with --set registryCA.configMapName: the values hold no
    registryCA.key, and the ConfigMap volume's item read {key: , path: ca.crt}, which the API server refuses. It is
    values.yaml's ca.crt, in the server's pods and the config check's."""
    given = ["--set", "registryCA.configMapName=corp-ca", "--set", "config.cuda.registry.enabled=true"]
    proc = _with_values_of_an_old_release(tmp_path, *given)
    assert proc.returncode == 0, proc.stderr
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    default = yaml.safe_load((CHART / "values.yaml").read_text())["registryCA"]["key"]
    pods = [find(objects, "Deployment"), find(objects, "Job", f"{FULLNAME}-config-check")]
    for pod in pods:
        volumes = {v["name"]: v for v in dig(pod, "spec", "template", "spec")["volumes"]}
        assert volumes["registry-ca"]["configMap"]["items"] == [{"key": default, "path": "ca.crt"}], pod["kind"]
        error = validate(json.dumps(pod, sort_keys=True), KUBERNETES_VERSIONS[-1])
        assert not error, f"{pod['kind']}: {error}"


def test_an_upgrade_reusing_values_without_the_cert_manager_cas_durations_says_what_to_do(tmp_path):
    """Its certManager mode had no CA of the chart's own: caDuration and caRenewBefore were read as nothing, and the
    render failed saying 'caRenewBefore (%!s(<nil>)) must be at least ...'."""
    proc = _with_values_of_an_old_release(tmp_path, "--set", "certs.mode=certManager")
    assert proc.returncode != 0
    assert "certs.certManager.caDuration is missing" in proc.stderr and "--reset-then-reuse-values" in proc.stderr


def test_an_upgrade_reusing_values_without_the_cert_manager_cas_durations_renders_with_an_issuer_of_your_own(
    tmp_path, validate
):
    """caDuration and caRenewBefore are the chart's CA's, made only without issuerRef: a release with an issuerRef of
    its own was refused for them all the same ('certs.certManager.caDuration is missing')."""
    issuer = [
        "--set",
        "certs.certManager.issuerRef.name=corp",
        "--set",
        "certs.certManager.issuerRef.kind=ClusterIssuer",
    ]
    proc = _with_values_of_an_old_release(tmp_path, "--set", "certs.mode=certManager", *issuer)
    assert proc.returncode == 0, proc.stderr
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    [certificate] = [o for o in objects if o["kind"] == "Certificate"]
    assert certificate["spec"]["issuerRef"]["name"] == "corp"
    for obj in objects:
        if obj["kind"] not in CRD_KINDS:
            error = validate(json.dumps(obj, sort_keys=True), KUBERNETES_VERSIONS[-1])
            assert not error, f"{obj['kind']}/{obj['metadata']['name']}: {error}"


def test_the_docs_name_exactly_the_job_pod_keys_the_chart_refuses():
    """The docs said a key under app.kubernetes.io/ or helm.sh/ is refused; only the keys the chart writes on the
    one-shot pods are (a review's finding): each of those fails the render, another under the same prefix does not,
    and docs/install.md names them all and no other."""
    opt_out = {"sidecar.istio.io/inject", "linkerd.io/inject"}
    written: dict[str, set[str]] = {"jobPodLabels": set(), "jobPodAnnotations": set()}
    for meta in _one_shot_pod_metadata(render_values("defaults")):
        written["jobPodLabels"] |= meta["labels"].keys() - opt_out
        written["jobPodAnnotations"] |= meta.get("annotations", {}).keys() - opt_out
    assert "helm.sh/hook" in written["jobPodAnnotations"] and "helm.sh/chart" in written["jobPodLabels"]
    for field, keys in written.items():
        _refused_keys(field, keys)
    for meta in _one_shot_pod_metadata(template("--set", "jobPodLabels.app\\.kubernetes\\.io/part-of=ml")):
        assert meta["labels"]["app.kubernetes.io/part-of"] == "ml"
    install = " ".join((ROOT / "docs" / "install.md").read_text().split())
    sentence = re.search(r"A key the chart writes on these pods is refused at render[^.]*(\.[^ ][^.]*)*\.", install)
    assert sentence, "docs/install.md: the sentence naming the refused keys"
    named = set(re.findall(r"`([^`]+/[^`]+)`", sentence.group(0)))
    assert named == written["jobPodLabels"] | written["jobPodAnnotations"]


def test_a_key_the_chart_writes_on_the_servers_pods_or_its_monitoring_objects_is_refused():
    """podLabels: {app.kubernetes.io/name: ...} rendered the label twice on the server's pods (a key twice, which
    kustomize and Argo CD refuse and kubectl and helm take either of), as podAnnotations did checksum/config and the
    ServiceMonitor's and dashboard's labels the chart's own: each is refused as jobPodLabels' are, and keys of the
    user's own under the same prefixes are written (a review's finding)."""
    on = "--set", "metrics.serviceMonitor.enabled=true", "--set", "grafanaDashboard.enabled=true"
    objects = template(*on)
    server = _pod_metadata(find(objects, "Deployment"))
    assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= server["labels"].keys()
    _refused_keys("podLabels", set(server["labels"]))
    _refused_keys("podAnnotations", set(server["annotations"]) - {SAFE_TO_EVICT_LOCAL})
    monitor = find(objects, "ServiceMonitor")["metadata"]["labels"]
    _refused_keys("metrics.serviceMonitor.labels", set(monitor), *on)
    dashboard = find(objects, "ConfigMap", f"{FULLNAME}-dashboard")["metadata"]["labels"]
    _refused_keys("grafanaDashboard.labels", set(dashboard) - {"grafana_dashboard"}, *on)
    part_of = "app.kubernetes.io/part-of"
    given = template(*on, "--set", "podLabels.app\\.kubernetes\\.io/part-of=ml", "--set", "podAnnotations.a/b=c")
    mine = _pod_metadata(find(given, "Deployment"))
    assert mine["labels"][part_of] == "ml" and mine["annotations"]["a/b"] == "c"
    assert mine["labels"].items() > server["labels"].items()


def _given_maps(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Where each map of labels or annotations the user gives is written: every object's that takes it."""
    one_shot = [_pod_metadata(o) for o in objects if o["kind"] in ("Job", "CronJob", "Pod")]
    server = _pod_metadata(find(objects, "Deployment"))
    return {
        "podLabels": [server["labels"]],
        "podAnnotations": [server["annotations"]],
        "jobPodLabels": [m["labels"] for m in one_shot],
        "jobPodAnnotations": [m["annotations"] for m in one_shot],
        "serviceAccount.annotations": [find(objects, "ServiceAccount", FULLNAME)["metadata"].get("annotations", {})],
        "metrics.serviceMonitor.labels": [find(objects, "ServiceMonitor")["metadata"]["labels"]],
        "grafanaDashboard.labels": [find(objects, "ConfigMap", f"{FULLNAME}-dashboard")["metadata"]["labels"]],
    }


def test_a_label_or_annotation_given_as_text_is_written_as_given_wherever_the_chart_takes_one(validate):
    """--set-string podLabels.spot=true (and a quoted "0123" in a values file) reach every object that takes the map
    as the text given, and every object is one Kubernetes takes."""
    on = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "grafanaDashboard.enabled=true"]
    fields = list(_given_maps(template(*on)))
    given = [
        a
        for field in fields
        for a in ("--set-string", f"{field}.example\\.com/on=true", "--set-string", f"{field}.n=0123")
    ]
    objects = template(*on, *given)
    for field, maps in _given_maps(objects).items():
        assert maps, field
        for found in maps:
            assert (found["example.com/on"], found["n"]) == ("true", "0123"), field
    for obj in objects:
        if obj["kind"] not in CRD_KINDS:
            error = validate(json.dumps(obj, sort_keys=True), KUBERNETES_VERSIONS[-1])
            assert not error, f"{obj['kind']}/{obj['metadata']['name']}: {error}"


@pytest.mark.parametrize(
    ("field", "written", "read_as"),
    [
        pytest.param("podLabels", "yes", "a boolean", id="yes"),
        pytest.param("podAnnotations", "off", "a boolean", id="off"),
        pytest.param("jobPodLabels", "n", "a boolean", id="n"),
        pytest.param("jobPodAnnotations", "0123", "a number", id="octal"),
        pytest.param("serviceAccount.annotations", "true", "a boolean", id="true"),
        pytest.param("metrics.serviceMonitor.labels", "1.10", "a number", id="float"),
        pytest.param("grafanaDashboard.labels", "5", "a number", id="digits"),
    ],
)
def test_a_label_or_annotation_a_values_file_gives_unquoted_as_a_boolean_or_number_is_refused(
    tmp_path, field, written, read_as
):
    """YAML 1.1 reads yes, no, on, off, y and n as booleans, and digits as a number (0123 as 83): the chart wrote them
    as "true", "false" and "83", not what was written. It cannot tell them from --set's, so it refuses them, saying
    how to give the value as text."""
    values = tmp_path / "values.yaml"
    *parents, last = field.split(".")
    text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents)) + f"{'  ' * len(parents)}{last}:\n"
    values.write_text(text + f"{'  ' * (len(parents) + 1)}team: {written}\n")
    on = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "grafanaDashboard.enabled=true"]
    proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *on, "-f", str(values), check=False)
    assert proc.returncode != 0 and f"{field}: team: " in proc.stderr, proc.stderr
    assert f"was read as {read_as}, not as text" in proc.stderr, proc.stderr
    assert 'quote it in your values file (team: "...")' in proc.stderr and "--set-string" in proc.stderr


@pytest.mark.parametrize("given", ["true", "5"])
def test_a_label_given_by_set_as_true_or_digits_is_refused_saying_to_use_set_string(given):
    """--set podLabels.spot=true is read as a boolean, as a values file's yes is: refused alike, not written."""
    proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--set", f"podLabels.spot={given}", check=False)
    assert proc.returncode != 0 and "podLabels: spot: " in proc.stderr and "--set-string" in proc.stderr, proc.stderr
    objects = template("--set-string", f"podLabels.spot={given}")
    assert _pod_metadata(find(objects, "Deployment"))["labels"]["spot"] == given


def _server(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = find(objects, "Deployment")
    spec = dig(deployment, "spec", "template", "spec")
    (container,) = spec["containers"]
    return spec, container


def test_server_container(rendered):
    name, objects = rendered
    spec, c = _server(objects)
    assert c["args"][0] == "serve"
    assert _arg(c["args"], "--cert") == "/tls/tls.crt" and _arg(c["args"], "--key") == "/tls/tls.key"
    # On the host network the ports are the node's (test_chart_hostnetwork.py).
    https, metrics = (10270, 10271) if name == "host-network" else (8443, 9090)
    assert _arg(c["args"], "--port") == str(https) and _arg(c["args"], "--metrics-port") == str(metrics)
    assert int(_arg(c["args"], "--workers")) >= 1
    assert _arg(c["args"], "--threads") == "512"
    # the request threads' memory: glibc's arenas, up to 8 a core, on a GPU node of 96 cores (Dockerfile too)
    assert {"name": "MALLOC_ARENA_MAX", "value": "2"} in c["env"]
    # gunicorn's drain fits in what the grace period leaves after the preStop sleep (30 - 5 - 2 by default)
    grace, pre_stop = spec["terminationGracePeriodSeconds"], c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert int(_arg(c["args"], "--graceful-timeout")) == grace - pre_stop - 2 == 23
    assert _arg(c["args"], "--config") == "/etc/gpu-admission/config.yaml"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"https": https, "metrics": metrics}
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"scheme": "HTTPS", "path": path, "port": "https"}
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] >= 1
    assert spec["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PROMETHEUS_MULTIPROC_DIR"] == "/tmp/metrics"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]] and "emptyDir" in volumes[mounts["/tmp/metrics"]]
    assert volumes[mounts["/tls"]]["secret"]["secretName"]
    assert "subPath" not in json.dumps(c["volumeMounts"]), "subPath mounts never see a renewed certificate"
    assert volumes[mounts["/etc/gpu-admission"]]["configMap"]["name"] == FULLNAME


@pytest.mark.parametrize(("name", "replicas", "pdb"), [("defaults", 2, True), ("ha-off", 1, False)])
def test_replicas_and_disruption_budget(name, replicas, pdb):
    objects = render_values(name)
    deployment = find(objects, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budgets = find_all(objects, "PodDisruptionBudget")
    if pdb:
        (budget,) = budgets
        assert budget["spec"]["minAvailable"] == 1
        labels = dig(deployment, "spec", "template", "metadata", "labels")
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    else:
        assert budgets == []


def test_replicas_spread_over_nodes():
    spec, _ = _server(render_values("defaults"))
    by_key = {t["topologyKey"]: t for t in spec["topologySpreadConstraints"]}
    assert by_key["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert by_key["kubernetes.io/hostname"]["maxSkew"] == 1
    assert "topology.kubernetes.io/zone" in by_key


def test_priority_class_settable():
    assert "priorityClassName" not in _server(render_values("defaults"))[0]
    assert _server(render_values("all-on"))[0]["priorityClassName"] == "system-cluster-critical"


def test_image_by_tag_or_digest():
    _, c = _server(render_values("defaults"))
    assert c["image"].endswith(":0.1.0")
    _, c = _server(render_values("all-on"))
    assert c["image"].endswith("@sha256:" + "0123456789abcdef" * 4)


@pytest.mark.parametrize(
    ("args", "image"),
    [
        # helm reads a value of digits alone as a number (found by a review: the schema refused it)
        pytest.param(["--set", "image.tag=123"], "123", id="digits"),
        pytest.param(["--set", "image.tag=0"], "0", id="zero"),
        pytest.param(["--set", "image.tag=0123"], "0123", id="leading-zero"),
        pytest.param(["--set", "image.tag=20240101"], "20240101", id="date"),
        pytest.param(["--set", "image.tag=v1.2"], "v1.2", id="text"),
        pytest.param(["--set", "image.tag=null"], "0.1.0", id="none"),
    ],
)
def test_an_image_tag_is_written_as_given(args, image):
    for where, spec in pod_specs(template(*args)):
        for container in spec["containers"]:
            assert container["image"] == f"ghcr.io/gpu-admission/gpu-admission:{image}", where


@pytest.mark.parametrize(
    ("tag", "read"),
    [
        pytest.param("20240101", "2.0240101e+07", id="date"),
        pytest.param("0123", "83", id="octal"),
        pytest.param("2.0", "2", id="whole-decimal"),
        pytest.param("123", "123", id="digits"),
    ],
)
def test_an_image_tag_of_digits_must_be_quoted_in_a_values_file(tmp_path, tag, read):
    # helm reads a number in a values file as a float, which the schema's integer lets by and which is not the tag as
    # written: 20240101 rendered an image :2.0240101e+07, 0123 one :83 (found by a review)
    values = tmp_path / "values.yaml"
    values.write_text(f"image: {{tag: {tag}}}\n")
    proc = helm("template", RELEASE, str(CHART), "-f", str(values), check=False)
    assert proc.returncode != 0
    assert f"image.tag: {read} was read as a number, not as text" in proc.stderr, proc.stderr
    assert 'quote it in your values file (tag: "...")' in proc.stderr, proc.stderr
    values.write_text(f'image: {{tag: "{tag}"}}\n')
    for where, spec in pod_specs(template("-f", str(values))):
        for container in spec["containers"]:
            assert container["image"] == f"ghcr.io/gpu-admission/gpu-admission:{tag}", where


def _template_given(tmp_path: Path, given: list[str]) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart with ``given``: ["--set", "k=v"], or ["--values", text], written to a file."""
    flag, value = given
    if flag == "--values":
        (tmp_path / "values.yaml").write_text(value + "\n")
        value = str(tmp_path / "values.yaml")
    return helm("template", RELEASE, str(CHART), flag, value, check=False)


@pytest.mark.parametrize(
    ("given", "read"),
    [
        pytest.param(["--values", "image: {tag: 1.10}"], "1.1 was read as a number", id="decimal"),
        pytest.param(["--values", "image: {tag: true}"], "true was read as a boolean", id="true"),
        pytest.param(["--values", "image: {tag: yes}"], "true was read as a boolean", id="yes"),
        pytest.param(["--set", "image.tag=true"], "true was read as a boolean", id="set-true"),
    ],
)
def test_an_image_tag_read_as_other_than_text_is_refused_saying_how_to_give_text(tmp_path, given, read):
    """YAML reads 1.10 as the number 1.1 and true or yes as a boolean: refused, not rendered as a tag never pushed.
    They met the schema's words ('got number, want integer or string'; 'got boolean'), not the chart's, which say how
    to give text (a review's finding)."""
    proc = _template_given(tmp_path, given)
    assert proc.returncode != 0
    assert f"image.tag: {read}, not as text" in proc.stderr, proc.stderr
    assert 'quote it in your values file (tag: "...")' in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "tag",
    [
        pytest.param("sha256:" + "0123456789abcdef" * 4, id="digest"),
        pytest.param("v1@sha256:" + "0123456789abcdef" * 4, id="tag-and-digest"),
        pytest.param("registry.example.com/gpu-admission:v1", id="reference"),
        pytest.param("-v1", id="leading-dash"),
    ],
)
def test_an_image_tag_that_is_not_a_tag_is_refused_pointing_at_image_digest(tag):
    """A digest given as the tag rendered the image `repo:sha256:...`, which Kubernetes refuses (InvalidImageName) at
    each pod, the chart installed (a review's finding). Refused in the chart's words, which point at image.digest;
    given there, the image is pulled by digest."""
    proc = helm("template", RELEASE, str(CHART), "--set-string", f"image.tag={tag}", check=False)
    assert proc.returncode != 0
    assert f'image.tag "{tag}" is not an image tag' in proc.stderr, proc.stderr
    assert "a digest goes in image.digest" in proc.stderr, proc.stderr
    digest = "sha256:" + "0123456789abcdef" * 4
    for where, spec in pod_specs(template("--set", f"image.digest={digest}")):
        for container in spec["containers"]:
            assert container["image"] == f"ghcr.io/gpu-admission/gpu-admission@{digest}", where


@pytest.mark.parametrize(
    ("given", "said"),
    [
        pytest.param(["--set", "image.tag=-1"], 'image.tag "-1" is not an image tag (up to 128 letters', id="set"),
        pytest.param(["--values", "image: {tag: -1}"], "image.tag: -1 was read as a number, not as text", id="values"),
    ],
)
def test_a_negative_image_tag_is_refused_in_the_charts_words(tmp_path, given, said):
    """image.tag=-1 met the schema's 'minimum: got -1, want 0', which says neither what a tag is nor how to give one
    (a review's finding); the chart's own words do."""
    proc = _template_given(tmp_path, given)
    assert proc.returncode != 0
    assert said in proc.stderr, proc.stderr
    assert "minimum" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("given", "said"),
    [
        pytest.param(["--set", "image.tag=true"], "image.tag: true was read as a boolean, not as text", id="set-true"),
        pytest.param(
            ["--values", "image: {tag: 1.10}"], "image.tag: 1.1 was read as a number, not as text", id="decimal"
        ),
        pytest.param(
            ["--set-string", "image.tag=sha256:" + "0123456789abcdef" * 4],
            "is not an image tag (up to 128 letters, digits, '_', '.' and '-', not first '.' or '-'), "
            "checked though image.digest is set and pulled instead",
            id="digest-as-tag",
        ),
    ],
)
def test_an_image_tag_beside_a_digest_is_checked_all_the_same(tmp_path, given, said):
    """With image.digest set, image.tag was not read at all: true, 1.10 (read as 1.1) or a digest rendered without a
    word (a review's finding), and the install broke only the day the digest was dropped. A valid tag beside the
    digest is taken, the digest pulled."""
    digest = "sha256:" + "0123456789abcdef" * 4
    flag, value = given
    if flag == "--values":
        (tmp_path / "values.yaml").write_text(value + "\n")
        value = str(tmp_path / "values.yaml")
    proc = helm("template", RELEASE, str(CHART), flag, value, "--set", f"image.digest={digest}", check=False)
    assert proc.returncode != 0
    assert said in proc.stderr, proc.stderr
    for where, spec in pod_specs(template("--set", "image.tag=v1.2", "--set", f"image.digest={digest}")):
        for container in spec["containers"]:
            assert container["image"] == f"ghcr.io/gpu-admission/gpu-admission@{digest}", where


def test_settings_config_map_adds_the_release_namespace_to_exemptions(rendered):
    _, objects = rendered
    settings = yaml.safe_load(find(objects, "ConfigMap", FULLNAME)["data"]["config.yaml"])
    assert NAMESPACE in settings["exemptions"]["namespaces"]
    assert len(settings["exemptions"]["namespaces"]) == len(set(settings["exemptions"]["namespaces"]))


def test_config_checksum_rolls_the_pods_on_change():
    def checksum(*args: str) -> str:
        deployment = find(template(*args), "Deployment")
        return str(dig(deployment, "spec", "template", "metadata", "annotations", "checksum/config"))

    base = checksum()
    assert len(base) == 64
    int(base, 16)
    assert checksum("--set", "config.cuda.mode=warn") != base
    assert checksum("--set", "replicaCount=3") == base


# --- optional objects and the helm test -------------------------------------------------------------------------


def test_optional_objects_only_when_enabled():
    defaults = {o["kind"] for o in render_values("defaults")}
    assert not {"ServiceMonitor", "NetworkPolicy"} & defaults
    objects = render_values("all-on")
    monitor = find(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    policy = find(objects, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    dashboards = [o for o in find_all(objects, "ConfigMap") if "gpu-admission.json" in o.get("data", {})]
    (dashboard,) = dashboards
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["gpu-admission.json"])["panels"]


def test_network_policy_lets_the_registry_reader_out_only_when_it_is_on():
    def egress_ports(*args: str) -> list[set[int]]:
        policy = find(template("--set", "networkPolicy.enabled=true", *args), "NetworkPolicy")
        return [{p["port"] for p in rule["ports"]} for rule in policy["spec"]["egress"]]

    assert egress_ports() == [{53}, {443, 6443}]
    on = egress_ports(
        "--set",
        "config.cuda.registry.enabled=true",
        "--set",
        "config.cuda.registry.plainHttp={registry.ml.svc:5000,mirror.local}",
        "--set",
        "config.cuda.registry.registries={nvcr.io,harbor.corp:8443}",
        "--set",
        "networkPolicy.apiServerPorts={6443}",
    )
    assert on == [{53}, {6443}, {443, 5000, 80, 8443}, {80}]
    # the last: EKS Pod Identity's agent, for the ECR logins' AWS credentials, and nowhere else on port 80
    policy = find(
        template("--set", "networkPolicy.enabled=true", "--set", "config.cuda.registry.enabled=true"), "NetworkPolicy"
    )
    to = [{"ipBlock": {"cidr": "169.254.170.23/32"}}, {"ipBlock": {"cidr": "fd00:ec2::23/128"}}]  # IPv4, IPv6 clusters
    assert policy["spec"]["egress"][-1]["to"] == to
    off = egress_ports("--set", "config.cuda.registry.enabled=true", "--set", "config.cuda.registry.ecr=false")
    assert off == [{53}, {443, 6443}, {443}]


def test_registry_credentials_are_mounted_and_named_in_the_settings():
    objects = render_values("all-on")
    deployment = find(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "registry-credentials"]
    assert volume["secret"] == {
        "secretName": "registry-pulls",
        "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
    }
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "registry-credentials"]
    config = yaml.safe_load(find(objects, "ConfigMap", f"{RELEASE}-gpu-admission")["data"]["config.yaml"])
    assert config["cuda"]["registry"]["credentialsFile"] == f"{mount['mountPath']}/config.json"
    assert mount["readOnly"] is True
    defaults = render_values("defaults")
    default_pod = find(defaults, "Deployment")["spec"]["template"]["spec"]
    assert "registry-credentials" not in {v["name"] for v in default_pod["volumes"]}
    policy = find(objects, "NetworkPolicy")
    assert {p["port"] for p in policy["spec"]["egress"][-2]["ports"]} == {443, 8443}


# The registry reader's files: (the file's settings key, the value that names the user's object, its text).
REGISTRY_FILES = [
    ("credentialsFile", "registryCredentials.secretName", "the file of the kubernetes.io/dockerconfigjson Secret"),
    ("caFile", "registryCA.configMapName", "the PEM bundle of the ConfigMap"),
]


@pytest.mark.parametrize(("file", "value", "holds"), REGISTRY_FILES, ids=["credentials", "ca"])
def test_a_registry_file_the_chart_would_not_mount_is_refused_with_one_message(file, value, holds):
    """Each mistake fails the render (the server would refuse to start, or the value would do nothing), with one
    message: a path of the settings' own got "both name ...: give one" beside the value, and giving one (the path)
    then got "a file the chart mounts into no pod" (a review's finding)."""
    enabled = ["--set", "config.cuda.registry.enabled=true"]
    own = ["--set", f"config.cuda.registry.{file}=/etc/mine"]
    named = ["--set", f"{value}=mine"]

    def refusal(*args: str) -> str:
        proc = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *args, check=False)
        assert proc.returncode != 0
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
        return line.split("): ", 1)[1]

    what = "the Secret" if file == "credentialsFile" else "the CA"
    for args in (named, [*named, *own]):
        assert refusal(*args) == (
            f"{value} is for the registry reader: set config.cuda.registry.enabled: true too (or leave {what} out)"
        )
    mine = (
        f"config.cuda.registry.{file} /etc/mine: leave it out of config; the chart sets it to {holds} named in {value},"
        " which it mounts (a path of your own is a file in no pod, and the server would refuse to start)"
    )
    assert refusal(*enabled, *own) == refusal(*enabled, *own, *named) == mine
    helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *enabled, *named)  # what the message asks for renders
    helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *own)  # the reader off: the server never reads the file


def test_a_registry_ca_is_mounted_and_named_in_the_settings():
    objects = template(
        "--set", "config.cuda.registry.enabled=true", "--set", "registryCA.configMapName=harbor-ca", "--set",
        "registryCA.key=root.pem",
    )  # fmt: skip
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "registry-ca"]
    assert volume["configMap"] == {"name": "harbor-ca", "items": [{"key": "root.pem", "path": "ca.crt"}]}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "registry-ca"]
    config = yaml.safe_load(find(objects, "ConfigMap", f"{RELEASE}-gpu-admission")["data"]["config.yaml"])
    assert config["cuda"]["registry"]["caFile"] == f"{mount['mountPath']}/ca.crt" and mount["readOnly"] is True


def test_helm_test_hook_sends_a_dry_run_pod_to_a_covered_namespace(rendered):
    name, objects = rendered
    (pod,) = [o for o in find_all(objects, "Pod") if hooks(o) == {"test"}]
    args = pod["spec"]["containers"][0]["args"]
    assert args[0] == "selftest"
    target = _arg(args, "--namespace")
    assert target != NAMESPACE, "the release namespace is never sent to the webhook"
    names = {h["name"] for _, h in webhooks(objects)}
    assert {args[i + 1] for i, a in enumerate(args) if a == "--webhook"} == names
    role = next(o for o in find_all(objects, "Role") if hooks(o) == {"test"})
    assert role["metadata"]["namespace"] == target
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    assert _arg(args, "--probe") == ("spot" if name == "all-on" else "fraction")


@pytest.mark.parametrize(
    ("namespace", "args"),
    [
        pytest.param("default", [], id="release-in-default-with-the-default-test-namespace"),
        pytest.param(NAMESPACE, ["--set", "test.namespace=kube-public"], id="exempted-namespace"),
        pytest.param(
            NAMESPACE, ["--set", "test.namespace=ml", "--set", "webhook.excludeNamespaces={ml}"], id="excluded"
        ),
    ],
)
def test_helm_test_to_a_namespace_never_sent_fails_saying_why(namespace, args, monkeypatch):
    # The probe would be admitted untouched and the test fail with "the webhook did not act": the test pod fails
    # at once with the reason instead, and the install's NOTES say it. The install itself still renders.
    objects = template(*args, namespace=namespace)
    (pod,) = [o for o in find_all(objects, "Pod") if hooks(o) == {"test"}]
    (container,) = pod["spec"]["containers"]
    assert "args" not in container
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "never sent to the webhook" in env["PROBLEM"] and "set test.namespace" in env["PROBLEM"]
    assert container["command"][:2] == ["python", "-c"]
    monkeypatch.setenv("PROBLEM", env["PROBLEM"])
    with pytest.raises(SystemExit) as exited:  # the container's program, as the image's python runs it
        exec(container["command"][2], {"__name__": "__main__"})
    assert "never sent to the webhook" in str(exited.value.code)
    assert [o for o in objects if o["kind"] in ("Role", "RoleBinding") and hooks(o) == {"test"}] == []
    notes = helm("install", RELEASE, str(CHART), "--dry-run=client", "-n", namespace, *args).stdout
    assert "WARNING: test.namespace" in notes


def test_dashboard_metrics_exist_in_the_server():
    """Every metric the dashboard queries is defined by the server (once the server defines metrics at all)."""
    import re

    dashboard = (CHART / "dashboards" / "gpu-admission.json").read_text()
    wanted = {re.sub(r"_bucket$", "", m) for m in re.findall(r"gpu_admission_[a-z_]+", dashboard)}
    source = "\n".join(p.read_text() for p in (ROOT / "webhook").rglob("*.py"))
    # prometheus_client names: Counter("requests", ..., namespace="gpu_admission") is gpu_admission_requests_total.
    short = re.findall(r"(?:Counter|Gauge|Histogram)\(\s*\"([a-z_]+)\"", source) if "gpu_admission" in source else []
    defined = {f"gpu_admission_{n}" for n in short}
    defined |= {f"gpu_admission_{n}" for n in re.findall(r"\{NAMESPACE\}_([a-z_]+)", source)}
    defined |= set(re.findall(r"[\"'](gpu_admission_[a-z_]+)[\"']", source))
    if not defined:
        pytest.skip("the server defines no gpu_admission_* metrics yet")
    defined |= {d + "_total" for d in defined}
    assert wanted <= defined, f"dashboard queries metrics the server does not define: {sorted(wanted - defined)}"


def test_server_pods_never_mount_the_ca_key() -> None:
    # The self-signed Secret keeps ca.key (so renewals keep the CA); only the serving pair reaches the server.
    objects = render_values("defaults")
    deployment = find(objects, "Deployment", FULLNAME)
    (tls,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert sorted(item["key"] for item in tls["secret"]["items"]) == ["tls.crt", "tls.key"]


def test_self_signed_pre_install_job_creates_the_secret_so_helm_wait_can_finish():
    # `helm install --wait` waits for the server's pods before post-install hooks run, and the pods need the
    # Secret: a pre-install Job creates it (only when missing), with its own hook-scoped RBAC; pre-upgrade too, for
    # an upgrade that finds none (certs.mode switched from provided).
    objects = render_values("defaults")
    (pre,) = [j for j in certs_jobs(objects) if hooks(j) == {"pre-install", "pre-upgrade"}]
    (container,) = pre["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["certs", "ensure"] and "--create-only" in args
    assert _arg(args, "--secret") == _tls_secret(objects)
    post = next(j for j in find_all(objects, "Job") if "post-install" in hooks(j))
    assert "--create-only" not in post["spec"]["template"]["spec"]["containers"][0]["args"]
    sa_name = pre["spec"]["template"]["spec"]["serviceAccountName"]
    sa = find(objects, "ServiceAccount", sa_name)
    assert hooks(sa) == {"pre-install", "pre-upgrade"}
    weight = int(pre["metadata"]["annotations"]["helm.sh/hook-weight"])
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        obj = find(objects, kind, sa_name)
        assert hooks(obj) == {"pre-install", "pre-upgrade"}
        assert int(obj["metadata"]["annotations"]["helm.sh/hook-weight"]) < weight, f"{kind} before the Job"
    assert _rules(objects, "Role", sa_name) == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [_tls_secret(objects)], "verbs": ["get"]},
    ]
    assert find(objects, "RoleBinding", sa_name)["subjects"][0]["name"] == sa_name


def test_the_service_monitor_selects_the_service():
    objects = template("--set", "metrics.serviceMonitor.enabled=true")
    wanted = find(objects, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    labels = find(objects, "Service")["metadata"]["labels"]
    assert wanted.items() <= labels.items()
    pods = find(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert find(objects, "Service")["spec"]["selector"].items() <= pods.items()


@pytest.mark.parametrize(
    ("release", "args", "given", "service"),
    [
        pytest.param("1abc", [], "1abc", "1abc-gpu-admission", id="release-from-a-digit"),
        # found by a review: helm takes a dot in a release name, the apiserver not in a Service's
        pytest.param("my.gpu", [], "my.gpu", "my.gpu-gpu-admission", id="release-with-a-dot"),
        pytest.param("r", ["--set", "fullnameOverride=gpu.admission"], "gpu.admission", "gpu.admission", id="override"),
        pytest.param("r", ["--set", "fullnameOverride=Webhook"], "Webhook", "Webhook", id="override-in-capitals"),
        pytest.param("r", ["--set", "nameOverride=gpu_admission"], "r", "r-gpu_admission", id="name-override"),
    ],
)
def test_a_name_kubernetes_refuses_for_a_service_is_refused_unless_overridden(release, args, given, service):
    """helm allows '1abc' and 'my.gpu' as release names; the Service each would make is not an RFC 1035 label, and
    the API refuses it."""
    refused = helm("template", release, str(CHART), "-n", NAMESPACE, *args, check=False)
    assert refused.returncode != 0
    assert (
        f"the release name {json.dumps(given)} (or fullnameOverride, nameOverride) makes the Service name "
        f"{json.dumps(service)}, which Kubernetes refuses: a Service name is an RFC 1035 label (lower case letters "
        "a-z, digits and '-', starting with a letter, ending with a letter or digit; no '.'). Choose such a release "
        "name, or set fullnameOverride to one"
    ) in refused.stderr, refused.stderr
    objects = [
        d for d in yaml.safe_load_all(helm("template", release, str(CHART), "--set", "fullnameOverride=w").stdout) if d
    ]
    assert find(objects, "Service")["metadata"]["name"] == "w"


def test_a_provided_ca_bundle_wrapped_over_lines_renders_as_one(tmp_path):
    """base64 wraps at 76 columns (and a values file's | block keeps its line breaks): the bundle is written as one
    string without them, as the API server reads caBundle."""
    pem = "-----BEGIN CERTIFICATE-----\n" + "A" * 200 + "\n-----END CERTIFICATE-----\n"
    wrapped = base64.encodebytes(pem.encode()).decode()
    assert "\n" in wrapped.strip()
    path = tmp_path / "ca.b64"
    path.write_text(wrapped)
    args = ["--set", "certs.mode=provided", "--set", "certs.provided.secretName=tls"]
    objects = template(*args, "--set-file", f"certs.provided.caBundle={path}")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(objects, kind)["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == "".join(wrapped.split())


def test_cluster_autoscaler_may_remove_the_node_of_a_replica():
    """The server's pods mount emptyDir volumes, and Cluster Autoscaler keeps every node that runs such a pod
    (--skip-nodes-with-local-storage, on by default): a replica on an untainted GPU node kept it rented."""
    spec = dig(find(template(), "Deployment"), "spec", "template")
    named = spec["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"]
    local = {v["name"] for v in spec["spec"]["volumes"] if "emptyDir" in v}
    assert set(named.split(",")) == local
    key = "podAnnotations.cluster-autoscaler\\.kubernetes\\.io/safe-to-evict-local-volumes"
    own = dig(find(template("--set-string", f"{key}=tmp"), "Deployment"), "spec", "template", "metadata")
    assert own["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"] == "tmp"
    # a values file whose podAnnotations is empty (null) still renders, as before the annotation
    emptied = dig(find(template("--set", "podAnnotations=null"), "Deployment"), "spec", "template", "metadata")
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes" in emptied["annotations"]


def test_the_pre_upgrade_hook_may_put_a_new_ca_into_the_configurations_and_pre_install_binds_nothing():
    """A Secret deleted by hand is made again by the pre-upgrade hook, which now puts the new CA beside the one the
    configurations trust: bound to the release's ClusterRole for them (certs/kube.py), on upgrades only (before an
    install that role does not exist, and binding it would take the installer the right to bind any role)."""
    objects = render_values("defaults")
    (pre,) = [o for o in find_all(objects, "ClusterRoleBinding") if o["metadata"]["name"].endswith("-certs-pre")]
    assert hooks(pre) == {"pre-upgrade"}
    role = find(objects, "ClusterRole", pre["roleRef"]["name"])
    assert role["rules"][0]["resources"] == ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    (job,) = [j for j in find_all(objects, "Job") if j["metadata"]["name"] == pre["metadata"]["name"]]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == pre["subjects"][0]["name"]
