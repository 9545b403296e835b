"""certs.mode=certManager: the chart's own CA chain, what the cainjector is pointed at, names, and the user's issuer.

Without certs.certManager.issuerRef the chart bootstraps a CA (cert-manager's documented pattern): selfSigned Issuer
-> CA Certificate (isCA) -> CA Issuer (spec.ca.secretName) -> serving Certificate. The cainjector copies ca.crt of
the Secret of the Certificate named by cert-manager.io/inject-ca-from; that Certificate must therefore be issued by
a CA (so ca.crt is the CA, the same across leaf renewals), never by the selfSigned Issuer (ca.crt would be the leaf
itself, a new one on every renewal, and the caBundle would change under the pods).

kubernetes-validate has no cert-manager schemas (test_chart.py skips CRD kinds): the fields written here are checked
against cert-manager.io/v1's field names below, so a misspelt field (isCa, rotationpolicy) fails.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.test_chart import (
    CHART,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    StrictLoader,
    find,
    find_all,
    helm,
    render_values,
    template,
)

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
INJECT = "cert-manager.io/inject-ca-from"
# cert-manager.io/v1 field names (Certificate.spec, .privateKey, .issuerRef; Issuer.spec, .ca).
CERTIFICATE_SPEC = {
    "additionalOutputFormats", "commonName", "dnsNames", "duration", "emailAddresses", "encodeUsagesInRequest",
    "ipAddresses", "isCA", "issuerRef", "keystores", "literalSubject", "nameConstraints", "otherNames", "privateKey",
    "renewBefore", "renewBeforePercentage", "revisionHistoryLimit", "secretName", "secretTemplate",
    "signatureAlgorithm", "subject", "uris", "usages",
}  # fmt: skip
PRIVATE_KEY = {"algorithm", "encoding", "rotationPolicy", "size"}
ISSUER_REF = {"group", "kind", "name"}
ISSUER_SPEC = {"acme", "ca", "selfSigned", "vault", "venafi"}
CA_ISSUER = {"crlDistributionPoints", "issuingCertificateURL", "ocspServers", "secretName"}
# DNS-1123 label: what Kubernetes allows for Service-like names, and what fits a label value.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
GO_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([hms])")


def seconds(duration: str) -> float:
    assert re.fullmatch(r"(?:[0-9]+(?:\.[0-9]+)?[hms])+", duration), duration
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in GO_DURATION.findall(duration))


def cert_manager_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["apiVersion"].startswith("cert-manager.io/")]


def chain(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(selfSigned Issuer, CA Certificate, CA Issuer, serving Certificate), each found exactly once."""
    issuers = find_all(objects, "Issuer")
    certificates = find_all(objects, "Certificate")
    (self_signed,) = [i for i in issuers if "selfSigned" in i["spec"]]
    (ca_issuer,) = [i for i in issuers if "ca" in i["spec"]]
    (ca,) = [c for c in certificates if c["spec"].get("isCA")]
    (serving,) = [c for c in certificates if not c["spec"].get("isCA")]
    assert len(issuers) == 2 and len(certificates) == 2
    return self_signed, ca, ca_issuer, serving


def injected_certificate(objects: list[dict[str, Any]], namespace: str = NAMESPACE) -> dict[str, Any]:
    """The Certificate both webhook configurations name in inject-ca-from, rendered in the release namespace."""
    (value,) = {find(objects, kind)["metadata"]["annotations"][INJECT] for kind in WEBHOOK_KINDS}
    ns, _, name = value.partition("/")
    assert ns == namespace, f"{INJECT}={value}: not the release namespace"
    (cert,) = [c for c in find_all(objects, "Certificate") if c["metadata"]["name"] == name]
    assert cert["metadata"]["namespace"] == namespace
    return cert


def test_own_ca_chain_selfsigned_issuer_signs_only_the_ca():
    objects = render_values("cert-manager")
    self_signed, ca, ca_issuer, serving = chain(objects)

    assert self_signed["spec"] == {"selfSigned": {}}
    # The CA Certificate: isCA, issued by the selfSigned Issuer, a key kept across its renewals.
    assert ca["spec"]["issuerRef"] == {
        "name": self_signed["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never"
    assert ca["spec"]["commonName"] and len(ca["spec"]["commonName"]) <= 64
    # The CA Issuer signs with the CA Certificate's Secret.
    assert ca_issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    # The serving Certificate: issued by the CA Issuer, never by the selfSigned one; a new key on each renewal.
    assert serving["spec"]["issuerRef"] == {
        "name": ca_issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert serving["spec"]["privateKey"]["rotationPolicy"] == "Always"
    assert f"{FULLNAME}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    assert "server auth" in serving["spec"]["usages"]
    # Two Secrets: the server mounts the serving one, never the CA's (its key signs anything).
    assert ca["spec"]["secretName"] != serving["spec"]["secretName"]
    deployment = find(objects, "Deployment", FULLNAME)
    (tls,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == serving["spec"]["secretName"]
    for obj in (self_signed, ca, ca_issuer, serving):
        assert obj["metadata"]["namespace"] == NAMESPACE


def test_durations_come_from_values_and_the_ca_outlives_a_leaf_issued_before_its_renewal():
    _, ca, _, serving = chain(
        template("--set", "certs.mode=certManager", "--set", "certs.certManager.caDuration=87600h")
    )
    assert ca["spec"]["duration"] == "87600h"
    _, ca, _, serving = chain(render_values("cert-manager"))
    assert (ca["spec"]["duration"], ca["spec"]["renewBefore"]) == ("43800h", "8760h")
    assert (serving["spec"]["duration"], serving["spec"]["renewBefore"]) == ("8760h", "720h")
    # The bundle is the CA of the leaf's Secret: a leaf issued just before the CA renews must renew before the
    # previous CA certificate expires.
    assert seconds(ca["spec"]["renewBefore"]) >= seconds(serving["spec"]["duration"])
    assert seconds(ca["spec"]["duration"]) > seconds(ca["spec"]["renewBefore"])


@pytest.mark.parametrize("namespace", [NAMESPACE, "other-ns"])
def test_inject_ca_from_names_the_serving_certificate_issued_by_the_ca(namespace):
    objects = template("--set", "certs.mode=certManager", namespace=namespace)
    cert = injected_certificate(objects, namespace)
    _, ca, ca_issuer, serving = chain(objects)
    # The cainjector copies ca.crt of this Certificate's Secret: issued by the CA Issuer that is the CA.
    assert cert is serving
    assert cert["spec"]["issuerRef"]["name"] == ca_issuer["metadata"]["name"]
    assert cert["spec"]["issuerRef"]["kind"] == "Issuer"
    issuer = find(objects, "Issuer", cert["spec"]["issuerRef"]["name"])
    assert "selfSigned" not in issuer["spec"], "the injected Certificate would be its own CA"
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    for kind in WEBHOOK_KINDS:
        assert all("caBundle" not in h["clientConfig"] for h in find(objects, kind)["webhooks"])


@pytest.mark.parametrize(
    ("release", "args"),
    [
        pytest.param(RELEASE, [], id="default-name"),
        pytest.param(RELEASE, ["--set", "fullnameOverride=" + "a" * 52], id="longest-override"),
        # helm allows 53 characters; the chart's fullname is then cut at 63.
        pytest.param("r" * 53, [], id="longest-release"),
        pytest.param("r" * 39 + "-gpu-admission", [], id="release-containing-the-chart-name"),
        # Cut at 63, the fullname ends in -ca: the CA's plain name would be the fullname itself.
        pytest.param("s" * 53, ["--set", "nameOverride=xxxxx-ca"], id="63-ending-in-ca"),
        pytest.param("t" * 52, ["--set", "nameOverride=xxxxxxx-ca"], id="62-ending-in-ca-after-a-cut-dash"),
    ],
)
def test_names_fit_kubernetes_limits_and_do_not_collide(release, args):
    proc = helm("template", release, str(CHART), "-n", NAMESPACE, "--set", "certs.mode=certManager", *args)
    objects = [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]
    self_signed, ca, ca_issuer, serving = chain(objects)
    names = [o["metadata"]["name"] for o in (self_signed, ca, ca_issuer, serving)]
    secrets = [ca["spec"]["secretName"], serving["spec"]["secretName"]]
    for name in [*names, *secrets]:
        assert DNS_LABEL.match(name), f"{name!r} ({len(name)} characters) is not a DNS-1123 label"
    assert len(ca["spec"]["commonName"]) <= 64
    assert self_signed["metadata"]["name"] != ca_issuer["metadata"]["name"]
    assert ca["metadata"]["name"] != serving["metadata"]["name"]
    assert len(set(secrets)) == 2
    assert injected_certificate(objects) is serving
    # The install's NOTES name the CA that is rendered (they had their own copy of the name, without the -ca2 case).
    notes = helm(
        "install", release, str(CHART), "--dry-run=client", "-n", NAMESPACE, "--set", "certs.mode=certManager", *args
    )
    assert f"get certificate,issuer {ca['metadata']['name']} " in notes.stdout


def test_user_issuer_renders_one_certificate_and_no_ca():
    objects = render_values("cert-manager-issuer")
    assert find_all(objects, "Issuer") == []
    (cert,) = find_all(objects, "Certificate")
    assert not cert["spec"].get("isCA")
    assert cert["spec"]["issuerRef"] == {"name": "company-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert injected_certificate(objects) is cert
    assert [o["kind"] for o in cert_manager_objects(objects)] == ["Certificate"]


@pytest.mark.parametrize(
    ("kind", "group"),
    [
        pytest.param("AWSPCAClusterIssuer", "awspca.cert-manager.io", id="aws-private-ca"),
        pytest.param("GoogleCASClusterIssuer", "cas-issuer.jetstack.io", id="google-cas"),
        pytest.param("ClusterIssuer", "cert-manager.io", id="cert-managers-own"),
    ],
)
def test_an_external_issuer_is_named_by_its_own_kind_and_group(kind, group):
    """The kinds of an external issuer's API group are its own (found by a review: only Issuer and ClusterIssuer
    were taken, whatever the group)."""
    objects = template(
        "--set", "certs.mode=certManager", "--set", "certs.certManager.issuerRef.name=pca",
        "--set", f"certs.certManager.issuerRef.kind={kind}", "--set", f"certs.certManager.issuerRef.group={group}",
    )  # fmt: skip
    assert injected_certificate(objects)["spec"]["issuerRef"] == {"name": "pca", "kind": kind, "group": group}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["kind=Vault"],
            "- at '/certs/certManager/issuerRef/kind': value must be one of 'Issuer', 'ClusterIssuer'",
            id="other-kind-of-cert-managers-group",
        ),
        pytest.param(
            ["kind=AWSPCAClusterIssuer", "group=cert-manager.io"],
            "- at '/certs/certManager/issuerRef/kind': value must be one of 'Issuer', 'ClusterIssuer'",
            id="external-kind-in-cert-managers-group",
        ),
        pytest.param(
            ["group=awspca.cert-manager.io"],
            "- at '/certs/certManager/issuerRef': missing property 'kind'",
            id="external-group-without-its-kind",
        ),
        pytest.param(
            ["kind=awspcaclusterissuer", "group=awspca.cert-manager.io"],
            "- at '/certs/certManager/issuerRef/kind': 'awspcaclusterissuer' does not match pattern "
            "'^[A-Z][A-Za-z0-9]*$'",
            id="not-a-kind",
        ),
    ],
)
def test_an_issuer_kind_its_group_does_not_have_is_refused(args, message):
    sets = ["certs.mode=certManager", "certs.certManager.issuerRef.name=pca"]
    sets += [f"certs.certManager.issuerRef.{a}" for a in args]
    proc = helm("template", "r", str(CHART), "-n", NAMESPACE, *[a for s in sets for a in ("--set", s)], check=False)
    assert proc.returncode != 0, f"helm accepted {args}"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["cert-manager", "cert-manager-issuer"])
def test_cert_manager_objects_use_only_known_fields(name):
    for obj in cert_manager_objects(render_values(name)):
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
        spec = obj["spec"]
        if obj["kind"] == "Certificate":
            assert set(spec) <= CERTIFICATE_SPEC, set(spec) - CERTIFICATE_SPEC
            assert set(spec["privateKey"]) <= PRIVATE_KEY
            assert set(spec["issuerRef"]) <= ISSUER_REF
            assert spec["privateKey"]["rotationPolicy"] in ("Never", "Always")
            assert spec.get("dnsNames") or spec.get("commonName"), "cert-manager needs a subject or a SAN"
        else:
            assert obj["kind"] == "Issuer"
            assert len(spec) == 1 and set(spec) <= ISSUER_SPEC
            assert set(spec.get("ca", {})) <= CA_ISSUER


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["certs.certManager.caRenewBefore=8759h59m59s"], "caRenewBefore", id="ca-renews-too-late"),
        pytest.param(["certs.certManager.caRenewBefore=43800h"], "caDuration", id="ca-renew-before-not-below-duration"),
        pytest.param(["certs.certManager.caDuration=5y"], "caDuration", id="not-a-go-duration"),
        pytest.param(["certs.certManager.caDurations=1h"], "caDurations", id="unknown-key"),
    ],
)
def test_bad_ca_settings_are_refused(args, message):
    sets = [a for s in ["certs.mode=certManager", *args] for a in ("--set", s)]
    proc = helm("template", "r", str(CHART), "-n", NAMESPACE, *sets, check=False)
    assert proc.returncode != 0, f"helm accepted {args}"
    assert message in proc.stderr, proc.stderr


# What cert-manager's webhook refuses of a Certificate (ValidateDuration: duration >= 1h, renewBefore >= 5m and below
# the duration) is refused at render, with the chart's CA or the user's issuer (found by a review: the default
# renewBefore with a 720h duration rendered, and cert-manager then refused the serving Certificate).
@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["certs.certManager.duration=720h"],
            "certs.certManager.renewBefore (720h) must be below certs.certManager.duration (720h): cert-manager "
            "refuses a Certificate that is due for renewal as soon as it is issued; shorten renewBefore (a third of "
            "the duration is cert-manager's own default)",
            id="renew-before-the-duration",
        ),
        pytest.param(
            ["certs.certManager.duration=2h", "certs.certManager.renewBefore=1h60m"],
            "certs.certManager.renewBefore (1h60m) must be below certs.certManager.duration (2h)",
            id="renew-before-the-duration-written-otherwise",
        ),
        pytest.param(
            ["certs.certManager.duration=30m", "certs.certManager.renewBefore=10m"],
            "certs.certManager.duration (30m) must be at least 1h: cert-manager refuses a shorter Certificate",
            id="duration-under-an-hour",
        ),
        pytest.param(
            ["certs.certManager.renewBefore=4m59s"],
            "certs.certManager.renewBefore (4m59s) must be at least 5m: cert-manager refuses a renewBefore under 5m",
            id="renew-before-under-5m",
        ),
    ],
)
@pytest.mark.parametrize(
    "issuer", [[], ["certs.certManager.issuerRef.name=company-ca"]], ids=["own-ca", "users-issuer"]
)
def test_serving_certificate_durations_cert_manager_refuses_are_refused(args, message, issuer):
    sets = [a for s in ["certs.mode=certManager", *issuer, *args] for a in ("--set", s)]
    proc = helm("template", "r", str(CHART), "-n", NAMESPACE, *sets, check=False)
    assert proc.returncode != 0, f"helm accepted {args}"
    assert message in proc.stderr, proc.stderr


def test_the_shortest_serving_certificate_cert_manager_takes_renders():
    objects = template(
        "--set", "certs.mode=certManager", "--set", "certs.certManager.duration=1h",
        "--set", "certs.certManager.renewBefore=59m59s", "--set", "certs.certManager.caRenewBefore=1h",
    )  # fmt: skip
    serving = chain(objects)[3]
    assert (serving["spec"]["duration"], serving["spec"]["renewBefore"]) == ("1h", "59m59s")
    objects = template("--set", "certs.mode=certManager", "--set", "certs.certManager.renewBefore=5m")
    assert chain(objects)[3]["spec"]["renewBefore"] == "5m"


def test_ca_settings_are_unused_with_a_users_issuer():
    # The guard on caRenewBefore is about the chart's CA; with your issuer there is none to check.
    objects = template(
        "--set", "certs.mode=certManager", "--set", "certs.certManager.issuerRef.name=company-ca",
        "--set", "certs.certManager.caRenewBefore=1h",
    )  # fmt: skip
    assert find_all(objects, "Issuer") == []
    assert len(find_all(objects, "Certificate")) == 1
