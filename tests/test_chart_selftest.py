"""`gpu-admission selftest` (the chart's helm test): the probe, the verdict, and the real client's dry-run call."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from tests.kubeapi import KubeAPI
from webhook import selftest
from webhook.selftest import Answer, judge, probe_pod

DENIED_BY_MUTATE = (
    'admission webhook "mutate.gpu-admission.io" denied the request: probe: nvidia.com/gpu 500m: no MIG profile '
    "is offered by the nodes this pod could run on"
)


def status_body(message: str, code: int = 400) -> str:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})


def returned(annotations: dict[str, str]) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": "gpu-admission-selftest-abcde", "annotations": annotations}}


@pytest.mark.parametrize(
    ("probe", "answer", "ok", "says"),
    [
        pytest.param(
            "fraction",
            Answer(obj=returned({"gpu-admission.io/mig": "probe: nvidia.com/gpu 500m -> x"})),
            True,
            "mutated",
            id="fraction-converted",
        ),
        pytest.param(
            "fraction",
            Answer(status=400, body=status_body(DENIED_BY_MUTATE)),
            True,
            "denied",
            id="fraction-denied-by-webhook",
        ),
        pytest.param(
            "spot",
            Answer(obj=returned({"gpu-admission.io/spot": "tolerate", "gpu-admission.io/spot-tolerations": "added 1"})),
            True,
            "spot-tolerations",
            id="spot-annotated",
        ),
        pytest.param(
            "spot",
            Answer(obj=returned({"gpu-admission.io/spot": "tolerate"})),
            False,
            "did not act",
            id="spot-only-own-annotation-is-not-an-answer",
        ),
        pytest.param("fraction", Answer(obj=returned({})), False, "did not act", id="admitted-untouched"),
        pytest.param(
            "fraction", Answer(obj={"kind": "Pod", "metadata": None}), False, "did not act", id="odd-shaped-answer"
        ),
        pytest.param(
            "fraction",
            Answer(
                status=422,
                body=status_body(
                    'Pod "x" is invalid: spec.containers[0].resources.requests'
                    '[nvidia.com/gpu]: Invalid value: "500m": must be an integer',
                    422,
                ),
            ),
            False,
            "never called",
            id="kubernetes-rejected-fraction-itself",
        ),
        pytest.param(
            "fraction",
            Answer(
                status=500,
                body=status_body(
                    'Internal error occurred: failed calling webhook "mutate.gpu-admission.io": tls: bad certificate',
                    500,
                ),
            ),
            False,
            "caBundle",
            id="webhook-unreachable",
        ),
        pytest.param(
            "fraction",
            Answer(status=400, body=status_body('admission webhook "other.example.com" denied the request: no')),
            False,
            "not by the webhook",
            id="denied-by-another-webhook",
        ),
        pytest.param(
            "fraction",
            Answer(status=503, body="<html>bad gateway</html>"),
            False,
            "bad gateway",
            id="non-json-error-body",
        ),
    ],
)
def test_judge(probe, answer, ok, says):
    got_ok, message = judge(probe_pod(probe), answer)
    assert got_ok is ok
    assert says in message


@pytest.mark.parametrize("probe", selftest.PROBES)
def test_probe_pod_is_restricted_compliant_and_asks_what_only_the_webhook_answers(probe):
    pod = probe_pod(probe)
    (c,) = pod["spec"]["containers"]
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["metadata"]["generateName"] and "name" not in pod["metadata"]
    if probe == "fraction":
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "0.5"
    else:
        assert pod["metadata"]["annotations"] == {"gpu-admission.io/spot": "tolerate"}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-admission")
    selftest.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["selftest", *argv])


def test_register_adds_the_subcommand():
    args = parse("--namespace", "team", "--probe", "spot", "--webhook", "a.example.com", "--webhook", "b.example.com")
    assert (args.namespace, args.probe, args.webhook) == ("team", "spot", ["a.example.com", "b.example.com"])
    assert args.func is selftest.run
    with pytest.raises(SystemExit):
        parse("--probe", "spot")  # --namespace is required


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        pytest.param(Answer(status=400, body=status_body(DENIED_BY_MUTATE)), 0, id="answered"),
        pytest.param(Answer(obj=returned({})), 1, id="not-answered"),
    ],
)
def test_run_exit_status(answer: Answer, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def create(namespace: str, pod: dict[str, Any]) -> Answer:
        calls.append((namespace, pod))
        return answer

    assert selftest.run(parse("--namespace", "team"), create=create) == code
    assert calls[0][0] == "team"
    out = capsys.readouterr()
    assert ("selftest passed" in out.out) if code == 0 else ("selftest FAILED" in out.err)


@pytest.mark.parametrize(
    ("spot_answer", "code"),
    [
        pytest.param(Answer(obj=returned({"gpu-admission.io/spot-applied": "tolerate"})), 0, id="validate-answers"),
        pytest.param(
            Answer(status=500, body=status_body('failed calling webhook "validate.gpu-admission.io": EOF', 500)),
            1,
            id="validate-unreachable",
        ),
    ],
)
def test_a_fraction_denied_by_mutate_sends_the_spot_probe_through_validate(
    spot_answer: Answer, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mutating webhook's denial ends admission: a broken validating webhook passed unseen (found by a review)."""
    sent: list[str] = []

    def create(namespace: str, pod: dict[str, Any]) -> Answer:
        probe = "spot" if "gpu-admission.io/spot" in (pod["metadata"].get("annotations") or {}) else "fraction"
        sent.append(probe)
        return spot_answer if probe == "spot" else Answer(status=400, body=status_body(DENIED_BY_MUTATE))

    assert selftest.run(parse("--namespace", "team"), create=create) == code
    assert sent == ["fraction", "spot"]
    out = capsys.readouterr()
    assert ("selftest passed" in out.out) if code == 0 else ("validate.gpu-admission.io" in out.err)


def test_run_without_cluster_fails_cleanly(capsys):
    def create(namespace: str, pod: dict[str, Any]) -> Answer:
        raise ConnectionRefusedError("connection refused")

    assert selftest.run(parse("--namespace", "team"), create=create) == 1
    assert "cannot reach the Kubernetes API" in capsys.readouterr().err


@pytest.fixture()
def kubeapi(tmp_path, monkeypatch):
    api = KubeAPI().start()
    monkeypatch.setenv("KUBECONFIG", api.kubeconfig(str(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield api
    api.stop()


def test_real_client_sends_a_dry_run_create_and_stores_nothing(kubeapi):
    create = selftest.kubernetes_create()
    answer = create("team", probe_pod("fraction"))
    assert answer.obj is not None and answer.obj["metadata"]["name"].startswith("gpu-admission-selftest-")
    (post,) = [path for method, path in kubeapi.requests if method == "POST"]
    assert post.startswith("/api/v1/namespaces/team/pods") and "dryRun=All" in post
    assert kubeapi.list("v1", "pods", "team") == []
    # This API server runs no webhook: the pod comes back untouched, which must fail the test.
    assert judge(probe_pod("fraction"), answer)[0] is False


def test_real_client_error_becomes_an_answer(kubeapi):
    kubeapi.fail_next(1, 500)
    answer = selftest.kubernetes_create()("team", probe_pod("fraction"))
    assert answer.obj is None and answer.status == 500 and "injected failure" in answer.body
