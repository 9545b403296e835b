"""The command line as users run it: review's exit codes and output, pools, and unusable input."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.serving import issue_certs
from webhook import cli as webhook_cli
from webhook import pipeline
from webhook.model import IGNORE_LABEL, WARNING_LIMIT, Context

NODES = EXAMPLES / "nodes.yaml"
CONFIG = EXAMPLES / "config.yaml"


def cli(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args], capture_output=True, text=True, timeout=60, input=stdin, cwd=cwd
    )


@pytest.mark.parametrize(
    ("args", "code"),
    [
        pytest.param(["--help"], 0, id="help"),
        pytest.param(["review", "-f", "examples/pod.yaml", "--nodes", "examples/nodes.yaml"], 0, id="review"),
        pytest.param(["review", "-f", "examples/pod.yaml", "--nodes", "nowhere.yaml"], 2, id="unusable"),
    ],
)
def test_python_dash_m_webhook_runs_the_gpu_admission_command(args: list[str], code: int) -> None:
    """`python -m webhook` said "No module named webhook.__main__" (found by a review): it runs the entry point
    pyproject.toml names for `gpu-admission`, with the same output and exit status."""
    scripts = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["gpu-admission"].split(":")
    entry = f"import sys; from {module} import {function}; sys.exit({function}())"
    runs = [
        subprocess.run([sys.executable, *how, *args], capture_output=True, text=True, timeout=60, cwd=EXAMPLES.parent)
        for how in (["-m", "webhook"], ["-c", entry])
    ]
    assert runs[0].returncode == code, runs[0].stderr
    assert [(r.returncode, r.stdout, r.stderr) for r in runs[1:]] == [(code, runs[0].stdout, runs[0].stderr)]


@pytest.fixture(scope="module")
def serving_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A serving certificate and its key (``serve`` builds its TLS context from them before it forks)."""
    return issue_certs(tmp_path_factory.mktemp("certs"))


def _manifest(tmp_path: Path, obj: Any) -> str:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def _pod(image: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "image": image, "resources": {"limits": limits}}]},
    }


def test_admitted_pod_exits_0_and_prints_its_annotations(tmp_path: Path) -> None:
    pod = _pod("pytorch/pytorch-nightly:2400000-cu12.4", {"nvidia.com/gpu": "0.5"})
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ADMITTED")
    assert "gpu-admission.io/mig: main: nvidia.com/gpu 0.5 -> nvidia.com/mig-" in run.stdout
    assert '"op":' in run.stdout


def test_an_admitted_workload_prints_its_pod_templates_annotations(tmp_path: Path) -> None:
    pod = _pod("pytorch/pytorch-nightly:2400000-cu12.4", {"nvidia.com/gpu": "0.5"})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod["spec"]},
        },
    }
    run = cli("review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 0, run.stderr
    assert "gpu-admission.io/mig: main: nvidia.com/gpu 0.5 -> nvidia.com/mig-" in run.stdout
    assert "gpu-admission.io/cuda: " in run.stdout


def test_denied_pod_exits_1_with_the_reason(tmp_path: Path) -> None:
    pod = _pod("pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime", {"nvidia.com/gpu": "1"})
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json")
    assert run.returncode == 1
    out = json.loads(run.stdout)
    assert out["allowed"] is False and out["patch"] == []
    assert "CUDA 13.0" in out["message"] and "main" in out["message"]


def test_manifest_from_stdin(tmp_path: Path) -> None:
    pod = _pod("nvidia/cuda:12.2.2-base-ubuntu22.04", {"nvidia.com/gpu": "1"})
    run = cli("review", "-f", "-", "--nodes", str(NODES), "-o", "json", stdin=json.dumps(pod))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["allowed"] is True


@pytest.mark.parametrize(
    ("manifest", "nodes", "words"),
    [
        pytest.param(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
            None,
            "kind 'ConfigMap' is not reviewed",
            id="not-reviewable",
        ),
        pytest.param("empty", None, "no object in it", id="empty"),
        pytest.param("not-yaml", None, "not valid YAML", id="garbage-manifest"),
        pytest.param(None, "missing", "cannot read", id="missing-nodes"),
        pytest.param(None, {"kind": "ConfigMap"}, "expected a Node", id="not-nodes"),
    ],
)
def test_unusable_input_exits_2_naming_it(tmp_path: Path, manifest: Any, nodes: Any, words: str) -> None:
    path = tmp_path / "m.yaml"
    if manifest == "empty":
        path.write_text("# nothing\n---\n")
    elif manifest == "not-yaml":
        path.write_text("kind: [Pod\n")
    else:
        path.write_text(yaml.safe_dump(manifest or _pod("x", {"nvidia.com/gpu": "1"})))
    nodes_path = NODES
    if nodes == "missing":
        nodes_path = tmp_path / "missing.yaml"
    elif nodes is not None:
        nodes_path = tmp_path / "nodes.yaml"
        nodes_path.write_text(yaml.safe_dump(nodes))
    run = cli("review", "-f", str(path), "--nodes", str(nodes_path))
    assert run.returncode == 2
    assert words in run.stderr and run.stdout == ""


GPU_CONTAINERS = (
    '[{name: t, image: "nvidia/cuda:13.0.0-runtime-ubuntu22.04", resources: {limits: {nvidia.com/gpu: 1}}}]'
)
GPU_CONTAINER = f"{{containers: {GPU_CONTAINERS}}}"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # a typo's lost pod spec was "ADMITTED (no pod spec to review)", exit 0: a CI gate let it through
        pytest.param(
            "kind: CronJob\nmetadata: {name: t}\nspec:\n  jobTemplate:\n    template:\n"
            f"      spec: {GPU_CONTAINER}\n",
            "a CronJob needs a mapping at spec.jobTemplate.spec (its pod spec at spec.jobTemplate.spec.template.spec);"
            " found nothing there",
            id="cronjob-without-job-spec",
        ),
        pytest.param(
            f"kind: Deployment\nmetadata: {{name: t}}\nspec:\ntemplate:\n  spec: {GPU_CONTAINER}\n",
            "a Deployment needs a mapping at spec (its pod spec at spec.template.spec); found nothing there",
            id="misindented-template",
        ),
        pytest.param(
            f"kind: Pod\nmetadata: {{name: t}}\nspec: null\ncontainers: {GPU_CONTAINER}\n",
            "a Pod needs a mapping at spec",
            id="pod-spec-null",
        ),
        pytest.param(
            f"kind: Pod\nspec: {GPU_CONTAINER}\n",
            "a Pod needs its metadata (a mapping with its name)",
            id="no-metadata",
        ),
        pytest.param(
            f"kind: Deployment\nspec:\n  template:\n    metadata: []\n    spec: {GPU_CONTAINER}\n",
            "spec.template.metadata is a list, not a mapping",
            id="metadata-list",
        ),
        # kubectl refuses these; the review read 12.4 as "CUDA unknown", and honoured spot: true
        pytest.param(
            "kind: Pod\nmetadata: {name: t, annotations: {gpu-admission.io/cuda-version: 12.4}}\n"
            f"spec: {GPU_CONTAINER}\n",
            "metadata.annotations.gpu-admission.io/cuda-version: 12.4 is not a string (YAML read it as a number)",
            id="unquoted-annotation",
        ),
        pytest.param(
            f"kind: Deployment\nspec:\n  template:\n    metadata: {{labels: {{on: yes}}}}\n    spec: {GPU_CONTAINER}\n",
            "spec.template.metadata.labels.true: true is not a string",
            id="template-label",
        ),
        # kubectl refuses these too (cannot unmarshal number into EnvVar.value of type string): the unquoted 12.10
        # was "CUDA unknown" and ADMITTED, the quoted one DENIED
        pytest.param(
            "kind: Pod\nmetadata: {name: t}\nspec:\n  containers:\n  - {name: t, image: myorg/app:1,"
            " env: [{name: CUDA_VERSION, value: 12.10}], resources: {limits: {nvidia.com/gpu: 1}}}\n",
            "m.yaml: spec.containers[0].env[0].value (container t, variable CUDA_VERSION): 12.1 is not a string (YAML"
            " read it as a number); quote it, as the API server takes only strings there\n",
            id="unquoted-env-value",
        ),
        pytest.param(
            "kind: CronJob\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n"
            f"          containers: {GPU_CONTAINERS}\n"
            "          initContainers: [{name: i, image: busybox,"
            " env: [{name: A, value: '1'}, {name: B, value: true}]}]\n",
            "m.yaml: spec.jobTemplate.spec.template.spec.initContainers[0].env[1].value (container i, variable B): true"
            " is not a string (YAML read it as a boolean)",
            id="template-init-container-env-value",
        ),
        pytest.param(
            f"kind: Pod\nmetadata: {{name: t}}\nspec:\n  containers: {GPU_CONTAINERS}\n"
            "  ephemeralContainers: [{name: debug, image: busybox, env: [{name: 7, value: x}]}]\n",
            "m.yaml: spec.ephemeralContainers[0].env[0].name (container debug): 7 is not a string",
            id="ephemeral-container-env-name",
        ),
        pytest.param("- a\n", "expected an object (a Pod or a workload), found a list", id="a-list"),
        pytest.param("42\n", "expected an object (a Pod or a workload), found the int '42'", id="a-number"),
        # a value YAML cannot build was a traceback and exit 1 ("denied")
        pytest.param(f"kind: Pod\nmetadata: {{name: {'9' * 5000}}}\n", "not valid YAML or JSON", id="huge-int"),
        pytest.param("kind: Pod\nmetadata: {name: !!int abc}\n", "not valid YAML or JSON", id="bad-tag"),
    ],
)
def test_a_manifest_the_api_server_would_refuse_exits_2_naming_it(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    run = cli("review", "-f", str(path), "--nodes", str(NODES))
    assert (run.returncode, run.stdout) == (2, ""), run.stdout + run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_output_that_cannot_be_written_exits_2_without_a_traceback(tmp_path: Path) -> None:
    """`review ... > /dev/full` was a traceback with exit 1, which says "denied"."""
    path = _manifest(tmp_path, _pod("nvidia/cuda:12.4.1-base-ubuntu22.04", {"nvidia.com/gpu": "1"}))
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "review", "-f", path, "--nodes", str(NODES)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2 and "No space left on device" in proc.stderr and "Traceback" not in proc.stderr


def test_a_yaml_manifest_is_read_as_kubectl_sends_it(tmp_path: Path) -> None:
    """An unquoted date stays the text it is written as (kubectl's YAML reader keeps it a string), and a key YAML
    reads as a number becomes its text: the review prints JSON, and the patch touches neither."""
    path = tmp_path / "m.yaml"
    pod = _pod("pytorch/pytorch-nightly:2400000-cu12.4", {"nvidia.com/gpu": "1"})
    annotations = "  annotations:\n    built: 2024-05-01\n    7: seven\n"
    text = yaml.safe_dump(pod).replace("  name: p\n", f"  name: p\n{annotations}")
    path.write_text(text)
    run = cli("review", "-f", str(path), "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    annotations = out["object"]["metadata"]["annotations"]
    assert annotations["built"] == "2024-05-01" and annotations["7"] == "seven"
    assert not [op for op in out["patch"] if op["path"].endswith(("/built", "/7"))]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (".nan", "spec.terminationGracePeriodSeconds: nan is not a JSON number"),
        ("-.inf", "spec.terminationGracePeriodSeconds: -inf is not a JSON number"),
        ("!!binary aGk=", "spec.terminationGracePeriodSeconds: binary data (!!binary) is not a JSON value"),
        ("!!set {a: null}", "spec.terminationGracePeriodSeconds: a set (!!set) is not a JSON value"),
        ("!!omap [a: 1]", "spec.terminationGracePeriodSeconds[0]: a key-value pair (!!pairs, !!omap) is not a JSON"),
    ],
)
def test_a_manifest_value_json_cannot_carry_exits_2_naming_where(tmp_path: Path, value: str, words: str) -> None:
    path = tmp_path / "m.yaml"
    pod = _pod("pytorch/pytorch-nightly:2400000-cu12.4", {"nvidia.com/gpu": "1"})
    path.write_text(yaml.safe_dump(pod).replace("spec:\n", f"spec:\n  terminationGracePeriodSeconds: {value}\n"))
    run = cli("review", "-f", str(path), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 2
    assert words in run.stderr and "the API server takes JSON" in run.stderr and run.stdout == ""


def test_yaml_aliases_that_expand_past_a_million_values_exit_2(tmp_path: Path) -> None:
    """A 629-byte file of nested aliases (billion laughs) grew the CLI to 1.3 GB before it crashed (found by a
    review that grew each part of a pod)."""
    laughs = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    laughs += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    pod = _pod("pytorch/pytorch-nightly:2400000-cu12.4", {"nvidia.com/gpu": "1"})
    text = yaml.safe_dump(pod).replace("spec:\n", "spec:\n  x-laughs:\n" + "".join(f"    {line}\n" for line in laughs))
    path = tmp_path / "laughs.yaml"
    path.write_text(text)
    assert len(text) < 1500
    run = cli("review", "-f", str(path), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 2, run.stderr[-500:]
    assert "more than 1,000,000 values once its YAML aliases are expanded" in run.stderr


def test_bad_settings_exit_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("cuda: {mode: block}\n")
    run = cli("pools", "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 2 and "cuda.mode" in run.stderr


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["review", "-f", str(EXAMPLES / "pod.yaml"), "--nodes", str(NODES)], id="review"),
        pytest.param(["pools", "--nodes", str(NODES)], id="pools"),
        pytest.param(["image", "nvidia/cuda:12.4.1-base-ubuntu22.04"], id="image"),
        pytest.param(["serve", "--nodes", str(NODES)], id="serve"),
    ],
)
def test_a_wrong_file_given_as_settings_is_named(command: list[str]) -> None:
    """A manifest given as --config said "gpu-admission: apiVersion: unknown setting", naming no file, where every
    other input error names its file (found by a review)."""
    pod = str(EXAMPLES / "pod.yaml")
    run = cli(*command, "--config", pod)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.startswith(f"gpu-admission: {pod}: apiVersion: unknown setting (known here: "), run.stderr


def test_stdin_is_not_read_for_both_the_manifest_and_the_nodes() -> None:
    """The second read found it empty, and the error said to make the node list with `kubectl get nodes -o yaml
    > -` (found by a review)."""
    run = cli("review", "-f", "-", "--nodes", "-", stdin=(EXAMPLES / "pod.yaml").read_text())
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        "gpu-admission: -f - and --nodes -: standard input can be read once; give the manifest or the nodes as a file\n"
    )


def test_nodes_from_an_empty_stdin_says_to_pipe_them() -> None:
    run = cli("pools", "--nodes", "-", stdin="")
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        "gpu-admission: -: standard input held no node list (pipe one in: kubectl get nodes -o yaml | gpu-admission"
        " ... --nodes -)\n"
    )


def test_pools_json_has_the_contract_fields() -> None:
    run = cli("pools", "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json")
    assert run.returncode == 0, run.stderr
    pools = json.loads(run.stdout)
    assert all(
        set(p) == {"name", "nodes", "gpu", "driver", "cuda", "migStrategy", "migProfiles", "spot"} for p in pools
    )
    by_name = {p["name"]: p for p in pools}
    assert by_name["h100-mixed"]["migStrategy"] == "mixed" and by_name["h100-mixed"]["migProfiles"]
    assert by_name["a100-spot"]["spot"] is True and by_name["a100-spot"]["driver"] == "550.90.07"


def test_pools_table_names_every_pool() -> None:
    run = cli("pools", "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 0
    for name in ("a100-spot", "h100-mixed", "inference", "h200-spot"):
        assert name in run.stdout


@pytest.mark.parametrize(("flags", "workers", "threads"), [([], 2, 512), (["--workers", "3", "--threads", "1"], 3, 1)])
def test_serve_takes_workers_and_threads(flags: list[str], workers: int, threads: int) -> None:
    from webhook.cli import build_parser
    from webhook.server import ServeOptions

    options = ServeOptions.from_args(build_parser().parse_args(["serve", *flags]))
    assert (options.workers, options.threads) == (workers, threads)


@pytest.mark.parametrize(("flags", "seconds"), [([], 25), (["--graceful-timeout", "13"], 13)])
def test_serve_hands_its_graceful_timeout_to_gunicorn(flags: list[str], seconds: int) -> None:
    """The chart sets it from the pod's grace period less the preStop sleep: gunicorn's own fixed 25 s drain outlived
    a shorter grace period, and the kubelet's SIGKILL cut the requests in flight."""
    from webhook.cli import build_parser
    from webhook.server import GunicornServer, ServeOptions

    options = ServeOptions.from_args(build_parser().parse_args(["serve", *flags]))
    assert options.graceful_timeout == seconds
    server = GunicornServer(options, lambda: (None, None))  # type: ignore[arg-type,return-value]
    assert server.cfg.graceful_timeout == seconds


def test_serve_holds_an_idle_connection_longer_than_the_apiserver_does() -> None:
    """kube-apiserver's webhook client drops an idle connection after 90 s (http.DefaultTransport's IdleConnTimeout,
    which k8s.io/apimachinery's transport defaults take): the server must not close it first."""
    from webhook.cli import build_parser
    from webhook.server import GunicornServer, ServeOptions

    options = ServeOptions.from_args(build_parser().parse_args(["serve"]))
    server = GunicornServer(options, lambda: (None, None))  # type: ignore[arg-type,return-value]
    assert server.cfg.keepalive > 90


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--graceful-timeout", "0"], "argument --graceful-timeout: must be a whole number of 1 or more (got '0')"),
        (["--workers", "0"], "argument --workers: must be a whole number of 1 or more (got '0')"),
        (["--threads", "-1"], "argument --threads: must be a whole number of 1 or more (got '-1')"),
        (["--threads", "many"], "argument --threads: must be a whole number of 1 or more (got 'many')"),
        (["--port", "70000"], "argument --port: must be a whole number from 1 to 65535 (got '70000')"),
        (["--metrics-port", "0"], "argument --metrics-port: must be a whole number from 1 to 65535 (got '0')"),
    ],
)
def test_serve_refuses_counts_and_ports_out_of_range(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook.cli import build_parser

    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["serve", *flags])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err


def test_serve_refuses_the_webhooks_port_for_metrics(serving_certs: Path) -> None:
    """Both ports listen on the same addresses: one port for both was accepted, /metrics could not bind, and the log
    said metrics were served there (found by a review)."""
    cert, key = str(serving_certs / "tls.crt"), str(serving_certs / "tls.key")
    run = cli(
        "serve", "--cert", cert, "--key", key, "--host", "127.0.0.1", "--port", "18443", "--metrics-port", "18443"
    )
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        "gpu-admission: --metrics-port 18443 is also --port, the webhook's, on the same addresses (--host): give"
        " /metrics a port of its own\n"
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        pytest.param(["--workers", "0"], "argument --workers: must be a whole number of 1 or more", id="workers"),
        pytest.param(
            ["--port", "9100", "--metrics-port", "9100"],
            "--metrics-port 9100 is also --port, the webhook's, on the same addresses (--host)",
            id="equal-ports",
        ),
        pytest.param([], "missing.crt: certificate or key file not found", id="no-certificate"),
    ],
)
def test_the_baseline_refuses_what_serve_refuses(
    capsys: pytest.CaptureFixture[str], serving_certs: Path, flags: list[str], said: str
) -> None:
    """The bench's no-op server takes serve's flags, and says what is wrong with them as serve does: a certificate
    that is not there ended in gunicorn's traceback."""
    from tests.bench import noop

    cert = "missing.crt" if not flags else str(serving_certs / "tls.crt")
    with pytest.raises(SystemExit) as stopped:
        noop.main(["--cert", cert, "--key", str(serving_certs / "tls.key"), *flags])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err


def test_log_records_collect_nothing_the_log_formats_do_not_show(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``setup_logging``: no caller lookup or thread names per record (the Events relay logs one per Event), and
    no format shows them; the process id stays (gunicorn's lines show it)."""
    from gunicorn.glogging import Logger

    for knob in ("_srcfile", "logThreads", "logMultiprocessing", "logProcesses"):  # as they were, after the test
        monkeypatch.setattr(logging, knob, getattr(logging, knob))
    webhook_cli.setup_logging()
    caplog.set_level("INFO", logger="gpu_admission.test")
    logging.getLogger("gpu_admission.test").info("one")
    (record,) = caplog.records
    assert (record.threadName, record.processName, record.process) == (None, None, os.getpid())
    assert (record.lineno, record.funcName) == (0, "(unknown function)")  # no caller looked up
    for used in (webhook_cli.LOG_FORMAT, Logger.error_fmt, Logger.access_fmt, Logger.syslog_fmt):
        assert not any(field in used for field in ("thread", "processName", "lineno", "filename", "funcName"))


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path: Path) -> None:
    """`gpu-admission review ... | head -1` printed a BrokenPipeError traceback (found by a review of provider
    journeys). The pipe's reader is gone before the first write here, so every write fails."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "pools", "--nodes", str(EXAMPLES / "nodes.yaml")],
        stdout=write,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=60,
    )
    os.close(write)
    assert proc.returncode == 141 and b"Traceback" not in proc.stderr, proc.stderr.decode()


def test_serve_reads_the_image_rules_before_its_workers_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serving_certs: Path
) -> None:
    """Each worker's first review read and compiled data/cuda-images.yaml (6-11 ms, a review of real images): the
    master reads it before the fork, and every worker inherits it."""
    from webhook import cuda_version, server
    from webhook.cli import build_parser, cmd_serve

    cert, key = serving_certs / "tls.crt", serving_certs / "tls.key"
    seen: list[int] = []
    monkeypatch.setattr(
        server.GunicornServer, "run", lambda self: seen.append(cuda_version.image_rules.cache_info().currsize)
    )
    monkeypatch.setattr(server, "prepare_metrics_dir", lambda prefix="": str(tmp_path))
    config = tmp_path / "config.yaml"
    config.write_text("audit:\n  events: false\n")  # no Events relay to fork
    cuda_version.image_rules.cache_clear()
    flags = ["--nodes", str(EXAMPLES / "nodes.yaml"), "--config", str(config), "--cert", str(cert), "--key", str(key)]
    args = build_parser().parse_args(["serve", *flags])
    try:
        assert cmd_serve(args) == 0
    finally:
        gc.unfreeze()  # cmd_serve froze what the test process holds
    assert seen == [1]


@pytest.mark.parametrize(
    ("flags", "config", "warned"),
    [
        pytest.param([], "", True, id="no-source"),
        pytest.param(["--nodes", str(EXAMPLES / "nodes.yaml")], "", False, id="nodes-file"),
        pytest.param(
            [],
            "cluster:\n  pools:\n  - {name: a100, nodeSelector: {pool: a100}, driverVersion: '570.124.06'}\n",
            False,
            id="pools",
        ),
    ],
)
def test_serve_without_nodes_says_so_at_start(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    serving_certs: Path,
    flags: list[str],
    config: str,
    warned: bool,
) -> None:
    """Found by a review: with no --nodes, no credentials and no declared pool, ``serve`` was ready with 0 nodes and
    admitted every GPU pod unchecked; only the Events relay's log line hinted why."""
    from webhook import server
    from webhook.cli import build_parser, cmd_serve

    cert, key = serving_certs / "tls.crt", serving_certs / "tls.key"
    monkeypatch.setattr(server.GunicornServer, "run", lambda self: None)
    monkeypatch.setattr(server, "prepare_metrics_dir", lambda prefix="": str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    settings = tmp_path / "config.yaml"
    settings.write_text("audit:\n  events: false\n" + config)  # no Events relay to fork
    args = build_parser().parse_args(
        ["serve", *flags, "--config", str(settings), "--cert", str(cert), "--key", str(key)]
    )
    caplog.set_level(logging.WARNING, "gpu_admission.cluster")
    try:
        assert cmd_serve(args) == 0
    finally:
        gc.unfreeze()  # cmd_serve froze what the test process holds
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == (1 if warned else 0), said
    if warned:
        assert said[0].startswith("cluster: no nodes known: no --nodes file, no in-cluster credentials"), said
        assert "CUDA check cannot run" in said[0] and "--nodes FILE" in said[0] and "set KUBECONFIG" in said[0]


def _admission_review(obj: dict[str, Any], operation: str = "CREATE", namespace: str = "ml") -> dict[str, Any]:
    request = {"uid": "u-1", "operation": operation, "namespace": namespace, "object": obj}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@pytest.mark.parametrize(
    ("review", "code", "words"),
    [
        pytest.param(
            EXAMPLES / "admission-review.json", 0, "nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb", id="readme-example"
        ),
        pytest.param(EXAMPLES / "admission-review-cuda13.json", 1, "needs CUDA 13.0", id="readme-denial"),
        # the request's namespace, the object naming none: an exempt one is skipped as the webhook skips it
        pytest.param(
            _admission_review(
                {**_pod("x", {"nvidia.com/gpu": "1"}), "metadata": {"name": "p"}}, namespace="kube-system"
            ),
            0,
            "ADMITTED (namespace kube-system is exempt)",
            id="request-namespace",
        ),
        # the request's operation: a pod update the webhook would answer without its stored pod
        pytest.param(
            _admission_review(_pod("x", {"nvidia.com/gpu": "1"}), operation="UPDATE"),
            0,
            "ADMITTED (pod update without the stored pod (oldObject))",
            id="request-operation",
        ),
    ],
)
def test_review_takes_an_admission_review(tmp_path: Path, review: Any, code: int, words: str) -> None:
    """Found by a review: ``review -f examples/admission-review.json`` said "kind 'AdmissionReview' is not
    reviewed"; its request's object is reviewed, in the request's namespace and operation."""
    path = review if isinstance(review, Path) else _manifest(tmp_path, review)
    run = cli("review", "-f", str(path), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == code, run.stderr
    assert words in run.stdout, run.stdout


@pytest.mark.parametrize(
    ("review", "words"),
    [
        pytest.param(
            _admission_review(_pod("x", {"nvidia.com/gpu": "1"}), operation="DELETE"),
            "request.operation is DELETE; the webhook reviews a CREATE or an UPDATE",
            id="delete",
        ),
        pytest.param(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
            "request is missing or not an object",
            id="no-request",
        ),
        pytest.param(
            _admission_review({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
            "request.object: kind 'ConfigMap' is not reviewed",
            id="not-reviewable-object",
        ),
    ],
)
def test_an_admission_review_that_cannot_be_reviewed_exits_2_naming_it(tmp_path: Path, review: Any, words: str) -> None:
    run = cli("review", "-f", _manifest(tmp_path, review), "--nodes", str(NODES))
    assert run.returncode == 2 and words in run.stderr, run.stderr


def test_review_refuses_a_replication_controller_naming_the_kinds_reviewed(tmp_path: Path) -> None:
    """Found by a review: a ReplicationController was reviewed, which the chart's webhook rules never send (DESIGN's
    list of manifest kinds has none)."""
    pod = _pod("nvidia/cuda:12.2.2-base-ubuntu22.04", {"nvidia.com/gpu": "1"})
    rc = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc"}, "spec": {"template": pod}}
    run = cli("review", "-f", _manifest(tmp_path, rc), "--nodes", str(NODES))
    assert run.returncode == 2, run.stdout
    kinds = "Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob"
    assert f"kind 'ReplicationController' is not reviewed (expected one of {kinds}, or an AdmissionReview" in run.stderr


def test_the_readmes_example_pod_is_reviewed() -> None:
    """Found by a review: the README's ``review -f my-pod.yaml`` named a pod no example held."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    command = (
        ".venv/bin/gpu-admission review -f examples/pod.yaml --nodes examples/nodes.yaml --config examples/config.yaml"
    )
    assert command in readme
    run = cli(*command.split()[1:], cwd=EXAMPLES.parent)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ADMITTED\ngpu-admission.io/cuda: triton: CUDA 12.4 from image tag"), run.stdout
    assert "required node affinity keeps it off pool NVIDIA-GeForce-RTX-4090" in run.stdout


def _make_run_config() -> str:
    """The settings file `make run` serves with (the Makefile's run target)."""
    (config,) = re.findall(r"^run:.*\n\t.* --config (\S+)", (EXAMPLES.parent / "Makefile").read_text(), re.M)
    return str(config)


def test_the_readme_says_where_the_example_admission_review_lands() -> None:
    """Found by a review: the README called examples/admission-review.json "half a GPU on spot capacity", and with
    the settings `make run` serves it becomes a MIG slice of the on-demand pool h100-mixed; examples/nodes.yaml sent
    the reader to examples/config-cluster.yaml for the declared pool's driver, not to those settings."""
    run = cli("review", "-f", "examples/admission-review.json", "--nodes", "examples/nodes.yaml", "--config",
              _make_run_config(), cwd=EXAMPLES.parent)  # fmt: skip
    assert run.returncode == 0, run.stderr
    (mig,) = re.findall(
        r"^gpu-admission.io/mig: trainer: nvidia.com/gpu 0.5 -> (\S+) \(.*, pool (\S+)\)$", run.stdout, re.M
    )
    readme = " ".join((EXAMPLES.parent / "README.md").read_text().split())
    said = re.search(r"send it the example AdmissionReview \((.*?)\):", readme)
    assert said and "spot capacity" in said.group(1), readme
    assert all(f"`{word}`" in said.group(1) for word in mig) and "on-demand" in said.group(1), (mig, said.group(1))
    header = "".join(line for line in NODES.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert re.findall(r"examples/config[-\w]*\.yaml", header) == [_make_run_config()], header


def _pod_update(image: str, gated: bool = True) -> dict[str, Any]:
    """examples/admission-review-cuda13.json made a pod UPDATE, as Kueue's ungate sends it: the pod reviewed at its
    create (the webhook's annotation on it), its ``kueue.x-k8s.io/admission`` gate on the stored pod only."""
    review: dict[str, Any] = json.loads((EXAMPLES / "admission-review-cuda13.json").read_text())
    request = review["request"]
    pod = request["object"]
    pod["spec"]["containers"][0]["image"] = image
    pod["metadata"]["annotations"] = {"gpu-admission.io/cuda": "trainer: reviewed at its create"}
    old = json.loads(json.dumps(pod))
    if gated:
        old["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    request.update(operation="UPDATE", oldObject=old)
    return review


@pytest.mark.parametrize(
    ("review", "code", "start"),
    [
        pytest.param(
            _pod_update("pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime"),
            1,
            "DENIED\ntaking away the pod's last scheduling gate (kueue.x-k8s.io/admission",
            id="ungate-denied",
        ),
        pytest.param(_pod_update("pytorch/pytorch-nightly:2400000-cu12.4"), 0, "ADMITTED\n", id="ungate-admitted"),
        pytest.param(
            _pod_update("pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime", gated=False),
            0,
            "ADMITTED (pod update leaves the webhook's annotations as they were)\n",
            id="other-update",
        ),
    ],
)
def test_review_of_a_pod_update_runs_validate_as_the_apiserver_does(
    tmp_path: Path, review: dict[str, Any], code: int, start: str
) -> None:
    """Found by a review: a pod UPDATE was answered by its mutating step alone, which skips an update that leaves
    the webhook's annotations as they were; the apiserver calls /validate too, which refuses an ungate where the
    pod's CUDA runs nowhere it may land now."""
    run = cli("review", "-f", _manifest(tmp_path, review), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == code, run.stderr
    assert run.stdout.startswith(start), run.stdout


@pytest.mark.parametrize(
    ("exemptions", "words"),
    [
        pytest.param({"users": ["alice@example.com"]}, "user alice@example.com is exempt", id="user"),
        pytest.param({"groups": ["system:authenticated"]}, "group system:authenticated is exempt", id="group"),
    ],
)
def test_review_of_an_admission_review_exempts_its_user_as_the_server_does(
    tmp_path: Path, exemptions: dict[str, list[str]], words: str
) -> None:
    """Found by a review: the request's userInfo was left out, so user and group exemptions never applied and
    examples/admission-review.json (alice's) was mutated where the server passes it untouched. Its nvidia.com/gpu
    0.5, left as it is, the API server then refuses."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": exemptions}))
    review = EXAMPLES / "admission-review.json"
    run = cli("review", "-f", str(review), "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1, run.stderr
    assert run.stdout.startswith("DENIED by the API server\n- container trainer: nvidia.com/gpu 0.5:"), run.stdout
    assert f"(the webhook passes it over, {words});" in run.stdout and "patch:" not in run.stdout, run.stdout


def _deployment(name: str, image: str, limits: dict[str, str]) -> dict[str, Any]:
    pod = _pod(image, limits)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]},
        },
    }


CUDA13 = "pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime"
CUDA124 = "pytorch/pytorch-nightly:2400000-cu12.4"


@pytest.mark.parametrize(
    ("limits", "image", "refused"),
    [
        pytest.param(
            {"gpu-admission.io/gpu-memory": "900Gi"}, CUDA124, "900Gi: largest offered is 3g.40gb", id="mig-no-profile"
        ),
        pytest.param(
            {"gpu-admission.io/gpu-memory": "20Gi"},
            CUDA13,
            "cuda: main needs CUDA 13.0: each pod will be denied",
            id="cuda-too-new",
        ),
    ],
)
def test_a_workload_whose_pods_would_each_be_refused_exits_1(
    tmp_path: Path, limits: dict[str, str], image: str, refused: str
) -> None:
    """The webhook admits a template whose gpu-memory ask its pods convert, each as it is created; where every pod
    would be refused, ``review`` said ADMITTED and exited 0, and a CI gate let the broken manifest through."""
    path = _manifest(tmp_path, _deployment("d", image, limits))
    text = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(CONFIG))
    assert text.returncode == 1, text.stderr
    assert text.stdout.startswith(
        "PODS DENIED\nthe webhook admits the Deployment itself, but would refuse each pod it makes"
    ), text.stdout
    assert f"- main: gpu-admission.io/gpu-memory {refused}" in text.stdout or f"- {refused}" in text.stdout
    assert refused not in "".join(line for line in text.stdout.splitlines() if line.startswith("Warning:"))
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json")
    assert run.returncode == 1, run.stderr
    out = json.loads(run.stdout)
    assert (out["allowed"], out["podsAllowed"]) == (True, False)  # the webhook's answer stays its own
    assert any(refused in w for w in out["warnings"])


def test_a_workload_whose_pods_cuda_mode_warn_only_warns_of_exits_0(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"cuda": {"mode": "warn"}}))
    path = _manifest(tmp_path, _deployment("d", CUDA13, {"gpu-admission.io/gpu-memory": "20Gi"}))
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "-o", "json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert (out["allowed"], out["podsAllowed"]) == (True, True)
    assert any("each pod will be warned of it (cuda mode warn)" in w for w in out["warnings"])


STREAM = [  # what ``helm template`` or ``kustomize build`` prints: workloads among other kinds, and a List
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ml"}, "spec": {}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}},
    {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            _pod("nvidia/cuda:12.2.2-base-ubuntu22.04", {"nvidia.com/gpu": "1"}),
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}},
        ],
    },
    _deployment("d", CUDA13, {"nvidia.com/gpu": "1"}),
]


def _stream(tmp_path: Path, docs: list[Any]) -> str:
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_a_stream_is_reviewed_object_by_object(tmp_path: Path) -> None:
    """``helm template ... | gpu-admission review -f -`` exited 2, "expected exactly one object"."""
    path = _stream(tmp_path, STREAM)
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 1, run.stderr  # the Deployment is denied
    pod_at, deployment_at = run.stdout.index("== Pod ml/p ("), run.stdout.index("== Deployment ml/d (")
    assert run.stdout.startswith(f"== Pod ml/p ({path}: document 3, items[0])\nADMITTED\n")
    assert f"== Deployment ml/d ({path}: document 4)\nDENIED\ncontainer main" in run.stdout
    assert pod_at < deployment_at
    assert run.stderr.splitlines() == [
        f"gpu-admission: {path}: document 1 (Service ml/web): not reviewed: kind 'Service' is not a Pod or a workload",
        f"gpu-admission: {path}: document 2 (ConfigMap cfg): not reviewed: kind 'ConfigMap' is not a Pod or a workload",
        f"gpu-admission: {path}: document 3, items[1] (Secret s): not reviewed: kind 'Secret' is not a Pod or a"
        " workload",
    ]
    run = cli(
        "review", "-f", "-", "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json", stdin=Path(path).read_text()
    )
    assert run.returncode == 1, run.stderr
    out = json.loads(run.stdout)
    assert [(o["kind"], o["name"], o["namespace"], o["allowed"]) for o in out] == [
        ("Pod", "p", "ml", True),
        ("Deployment", "d", "ml", False),
    ]
    assert "podsAllowed" not in out[0] and out[1]["podsAllowed"] is False
    assert set(out[0]) == {"kind", "name", "namespace", "allowed", "message", "warnings", "patch", "object"}


def test_a_stream_of_admitted_objects_exits_0(tmp_path: Path) -> None:
    docs = [STREAM[0], _deployment("a", CUDA124, {"nvidia.com/gpu": "0.5"}), _pod(CUDA124, {"nvidia.com/gpu": "1"})]
    run = cli("review", "-f", _stream(tmp_path, docs), "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json")
    assert run.returncode == 0, run.stderr
    assert [(o["kind"], o["allowed"], o.get("podsAllowed")) for o in json.loads(run.stdout)] == [
        ("Deployment", True, True),
        ("Pod", True, None),
    ]


def test_a_list_of_one_object_prints_the_one_object(tmp_path: Path) -> None:
    """One object stays the contract's one object, whether a document or the only item of a List."""
    listed = {"apiVersion": "v1", "kind": "List", "items": [_pod(CUDA124, {"nvidia.com/gpu": "1"})]}
    run = cli("review", "-f", _manifest(tmp_path, listed), "--nodes", str(NODES), "-o", "json")
    assert run.returncode == 0, run.stderr
    assert set(json.loads(run.stdout)) == {"allowed", "message", "warnings", "patch", "object"}


def test_an_unusable_document_in_a_stream_exits_2_naming_it(tmp_path: Path) -> None:
    bad = _pod(CUDA124, {"nvidia.com/gpu": "1"})
    bad["metadata"].update(name="bad", labels={"tier": 1})
    path = _stream(tmp_path, [_pod(CUDA124, {"nvidia.com/gpu": "1"}), STREAM[0], bad, 42])
    run = cli("review", "-f", path, "--nodes", str(NODES))
    assert run.returncode == 2
    assert run.stdout.startswith(f"== Pod ml/p ({path}: document 1)\nADMITTED\n"), run.stdout  # the others are
    said = run.stderr.splitlines()
    assert said[1].startswith(
        f"gpu-admission: {path}: document 3 (Pod ml/bad): metadata.labels.tier: 1 is not a string"
    )
    assert said[2:] == [
        f"gpu-admission: {path}: document 4: expected an object (a Pod or a workload), found the int '42'",
        f"gpu-admission: {path}: 2 of its 4 objects could not be reviewed",
    ]


def test_an_admission_review_in_a_stream_is_named_by_the_object_it_carries(tmp_path: Path) -> None:
    """Its header and its messages said "(AdmissionReview (no name))": they name the request's object (its
    generateName where it has no name, the request's namespace where it names none) and say it came in one."""
    pod = {**_pod(CUDA124, {"nvidia.com/gpu": "1"}), "metadata": {"generateName": "trainer-"}}
    admitted, deleted = _admission_review(pod), _admission_review(pod, operation="DELETE")
    path = _stream(tmp_path, [admitted, deleted])
    run = cli("review", "-f", path, "--nodes", str(NODES))
    assert run.returncode == 2, run.stderr
    assert run.stdout.startswith(f"== Pod ml/trainer- ({path}: document 1, in an AdmissionReview)\nADMITTED\n")
    assert run.stderr.splitlines()[0] == (
        f"gpu-admission: {path}: document 2 (Pod ml/trainer- in an AdmissionReview): request.operation is DELETE;"
        " the webhook reviews a CREATE or an UPDATE"
    ), run.stderr


def test_a_stream_with_nothing_to_review_exits_2_saying_so(tmp_path: Path) -> None:
    run = cli("review", "-f", _stream(tmp_path, STREAM[:2]), "--nodes", str(NODES))
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines()[-1].endswith(
        "stream.yaml: nothing to review: none of its 2 objects is a Pod or a workload (Pod, Deployment, StatefulSet,"
        " DaemonSet, ReplicaSet, Job, CronJob), or an AdmissionReview of one"
    )


def test_documents_are_numbered_as_they_stand_in_the_text(tmp_path: Path) -> None:
    """Empty and null documents were left out of the count: the header named document 2 for the fourth."""
    pod, deployment = (yaml.safe_dump(o) for o in (_pod(CUDA124, {"nvidia.com/gpu": "1"}), STREAM[3]))
    path = tmp_path / "stream.yaml"
    path.write_text(f"---\n# only a comment\n---\n---\nnull\n---\n{pod}---\n~\n---\n{deployment}")
    run = cli("review", "-f", str(path), "--nodes", str(NODES), "--config", str(CONFIG))
    headers = [line for line in run.stdout.splitlines() if line.startswith("== ")]
    assert headers == [f"== Pod ml/p ({path}: document 4)", f"== Deployment ml/d ({path}: document 6)"], run.stdout


@pytest.mark.parametrize("command", [["pools"], ["review", "-f", str(EXAMPLES / "pod.yaml")]])
def test_node_list_documents_are_numbered_as_they_stand_in_the_text(tmp_path: Path, command: list[str]) -> None:
    """As a manifest's are: the node list's comment-only first document was left out of the count, and the Pod
    in the third was said to be in document 2."""
    node = yaml.safe_load(NODES.read_text())["items"][0]
    path = tmp_path / "nodes.yaml"
    path.write_text(f"---\n# only a comment\n---\n{yaml.safe_dump(node)}---\n{yaml.safe_dump(_pod(CUDA124, {}))}")
    run = cli(*command, "--nodes", str(path))
    assert run.returncode == 2, run.stdout
    assert f"{path}: document 3: expected a Node, a NodeList or a List of Nodes (found kind 'Pod')" in run.stderr


def test_lists_inside_lists_are_opened_at_every_depth(tmp_path: Path) -> None:
    """kubectl opens a List inside a List (cli-runtime's FlattenListVisitor); review passed it over and exited 0
    where the Pod inside it is denied."""
    denied = _pod(CUDA124, {"nvidia.com/gpu": "1.5"})
    inner = {"apiVersion": "v1", "kind": "List", "items": [STREAM[1], denied]}
    outer = {"apiVersion": "v1", "kind": "List", "items": [inner, STREAM[0]]}
    path = _stream(tmp_path, [outer, _pod(CUDA124, {"nvidia.com/gpu": "1"})])
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 1, run.stderr
    assert run.stdout.startswith(f"== Pod ml/p ({path}: document 1, items[0].items[1])\nDENIED\n"), run.stdout
    assert f"{path}: document 1, items[0].items[0] (ConfigMap cfg): not reviewed" in run.stderr
    deep: dict[str, Any] = denied
    for _ in range(webhook_cli.MAX_LIST_DEPTH + 1):
        deep = {"apiVersion": "v1", "kind": "List", "items": [deep]}
    run = cli("review", "-f", _manifest(tmp_path, deep), "--nodes", str(NODES))
    assert run.returncode == 2 and "items[0]: Lists nested more than 16 deep" in run.stderr, run.stderr


@pytest.mark.parametrize(
    ("limits", "annotations", "asked"),
    [
        pytest.param({"gpu-admission.io/gpu-memory": "60Gi"}, {}, "gpu-admission.io/gpu-memory 60Gi", id="memory"),
        pytest.param(
            {}, {"gpu-admission.io/gpu-fraction": "0.9"}, "gpu-admission.io/gpu-fraction 0.9", id="annotation"
        ),
    ],
)
def test_a_workload_whose_pods_get_the_fallback_is_not_pods_denied(
    tmp_path: Path, limits: dict[str, str], annotations: dict[str, str], asked: str
) -> None:
    """With mig.fallback whole, an ask no profile holds (3g.40gb is the largest offered) gives each pod a whole GPU;
    its workload said PODS DENIED ('its pods are refused') and exited 1."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mig": {"fallback": "whole"}}))
    deployment = _deployment("d", CUDA124, limits)
    deployment["spec"]["template"]["metadata"]["annotations"] = annotations
    pod = _pod(CUDA124, limits)
    pod["metadata"]["annotations"] = annotations
    fallback = "nvidia.com/gpu 1 (whole GPU: no MIG profile covers it)"
    alone = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(config))
    assert alone.returncode == 0 and f"Warning: main: {asked} -> {fallback}" in alone.stdout, alone.stdout
    run = cli(
        "review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(config), "-o", "json"
    )
    assert run.returncode == 0, run.stdout
    out = json.loads(run.stdout)
    assert (out["allowed"], out["podsAllowed"]) == (True, True)
    assert f"main: {asked}: its pods get {fallback}" in out["warnings"]
    assert not any("refused" in w for w in out["warnings"]), out["warnings"]


def test_a_denied_workload_keeps_the_warning_that_its_pods_are_refused(tmp_path: Path) -> None:
    """A DENIED workload's text left out each warning that its pods are refused, said on PODS DENIED alone."""
    deployment = _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "900Gi"})
    containers = deployment["spec"]["template"]["spec"]["containers"]
    containers.append({"name": "u", "image": CUDA124, "resources": {"limits": {"nvidia.com/gpu": "1.5"}}})
    run = cli("review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 1 and run.stdout.startswith("DENIED\ncontainer u asks for nvidia.com/gpu 1.5"), run.stdout
    assert "\nWarning: main: gpu-admission.io/gpu-memory 900Gi: largest offered is 3g.40gb" in run.stdout, run.stdout


def test_review_prints_the_same_refusal_of_several_containers_once_naming_them_all(tmp_path: Path) -> None:
    """It printed one paragraph a container, the same but for the name (a pod of three 900Gi asks: three)."""
    pod = _pod(CUDA124, {"gpu-admission.io/gpu-memory": "900Gi"})
    main = pod["spec"]["containers"][0]
    pod["spec"]["containers"] += [{**main, "name": "b"}, {**main, "name": "c"}]
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == 1, run.stdout
    said = run.stdout.split("\n")
    assert said[0] == "DENIED" and said[1].startswith("each of containers main, b and c asks for gpu-admission.io/")
    assert not any("900Gi" in line for line in said[2:]), run.stdout


def test_a_workload_whose_pod_template_opts_out_is_not_pods_denied(tmp_path: Path) -> None:
    """Its pods carry its template's labels, so each passes untouched: a template labelled to opt out got 'its
    pods are refused', and review PODS DENIED (exit 1)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"allowOptOutLabel": True}}))
    deployment = _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "900Gi"})
    deployment["spec"]["template"]["metadata"]["labels"]["gpu-admission.io/ignore"] = "true"
    run = cli(
        "review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(config), "-o", "json"
    )
    assert run.returncode == 1, run.stdout  # its pods stay Pending (the size is never converted), not refused
    out = json.loads(run.stdout)
    assert (out["allowed"], out["podsAllowed"], out["podsRefused"]) == (True, True, [])
    assert [p.split(",")[0] for p in out["podsPending"]] == ["main: its pods stay Pending"], out
    opted = "its pods pass untouched, none refused (label gpu-admission.io/ignore=true on its pod template)"
    assert opted in out["warnings"] and not any("its pods are refused" in w for w in out["warnings"]), out["warnings"]


def _refused_deployment(workload_labels: dict[str, str], template_labels: dict[str, str]) -> dict[str, Any]:
    """A Deployment whose pods the webhook would each refuse (a memory size no MIG profile holds)."""
    deployment = _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "900Gi"})
    deployment["metadata"]["labels"] = workload_labels
    deployment["spec"]["template"]["metadata"]["labels"].update(template_labels)
    return deployment


OPT_OUT = {"gpu-admission.io/ignore": "true"}
TOO_LARGE = "main: gpu-admission.io/gpu-memory 900Gi: largest offered is 3g.40gb; ask for less or its pods are refused"


RS_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"


PASSED_OVER = "the webhook passes the Deployment itself over"
STAY_PENDING = "- main: its pods stay Pending, gpu-memory 900Gi unconverted: ask a whole nvidia.com/gpu or"


@pytest.mark.parametrize(
    ("manifest", "settings", "namespace", "head", "why"),
    [
        pytest.param(
            _refused_deployment(OPT_OUT, OPT_OUT),
            {"exemptions": {"allowOptOutLabel": True}},
            "ml",
            f"{PASSED_OVER} (label gpu-admission.io/ignore=true (opt-out allowed by settings)), but its pods' GPU"
            f" ask is never converted:\n{STAY_PENDING}",
            "label gpu-admission.io/ignore=true on its pod template",
            id="both-opt-out",
        ),
        pytest.param(
            _refused_deployment({}, {}),
            {"exemptions": {"namespaces": ["ml"]}},
            "ml",
            f"{PASSED_OVER} (namespace ml is exempt), but its pods' GPU ask is never converted:\n" + STAY_PENDING,
            "namespace ml is exempt",
            id="namespace-exempt",
        ),
        # the controllers create the pods: their own user or group exempt passes them untouched
        pytest.param(
            _refused_deployment({}, {}),
            {"exemptions": {"users": [RS_CONTROLLER]}},
            "ml",
            "the webhook admits the Deployment itself, but its pods' GPU ask is never converted:\n- main:"
            " its pods stay Pending, gpu-memory 900Gi unconverted: ask a nvidia.com/gpu fraction or",
            f"exemptions.users has {RS_CONTROLLER}, their creator",
            id="controller-exempt",
        ),
        pytest.param(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "u-1",
                    "operation": "CREATE",
                    "namespace": "ml",
                    "userInfo": {"username": "ci-deployer"},
                    "object": {**_refused_deployment({}, {}), "kind": "Job", "apiVersion": "batch/v1"},
                },
            },
            {"exemptions": {"users": ["ci-deployer"], "groups": ["system:serviceaccounts:kube-system"]}},
            "ml",
            "the webhook passes the Job itself over (user ci-deployer is exempt), but its pods' GPU ask is"
            f" never converted:\n{STAY_PENDING}",
            "exemptions.groups has system:serviceaccounts:kube-system, a group of their creator"
            " system:serviceaccount:kube-system:job-controller",
            id="exempt-creator-and-controller",
        ),
    ],
)
def test_a_workload_whose_pods_pass_untouched_is_not_pods_denied(
    tmp_path: Path, manifest: dict[str, Any], settings: dict[str, Any], namespace: str, head: str, why: str
) -> None:
    """Its pods carry its template's labels and are made in its namespace: passed untouched, none is refused, and
    podsAllowed (they are admitted); their memory size, no MIG profile's, is never converted: PODS PENDING, exit 1,
    for a CI gate to catch, saying why they pass (found by a review: ADMITTED, exit 0)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    path = _manifest(tmp_path, manifest)
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "--namespace", namespace)
    assert run.returncode == 1 and run.stdout.startswith(f"PODS PENDING\n{head}"), run.stdout
    assert f"they pass untouched ({why})" in run.stdout, run.stdout
    assert "refused" not in run.stdout.replace("none refused", ""), run.stdout
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "-o", "json")
    out = json.loads(run.stdout)
    assert (out["allowed"], out["podsAllowed"], out["podsRefused"]) == (True, True, []), out
    assert len(out["podsPending"]) == 1 and f"they pass untouched ({why})" in out["podsPending"][0], out


def _created_by(user: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    review = _admission_review(obj, operation="UPDATE" if old else "CREATE")
    review["request"].update(userInfo={"username": user}, **({"oldObject": old} if old else {}))
    return review


def _owned_replica_set() -> dict[str, Any]:
    replica_set = _refused_deployment({}, {})
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u", "controller": True}
    replica_set.update(kind="ReplicaSet", metadata={"name": "d-5f6d", "namespace": "ml", "ownerReferences": [owner]})
    return replica_set


@pytest.mark.parametrize(
    ("review", "skipped"),
    [
        pytest.param(_created_by("ci-deployer", _refused_deployment({}, {})), "user ci-deployer is exempt", id="user"),
        pytest.param(
            _refused_deployment(OPT_OUT, {}),
            "label gpu-admission.io/ignore=true (opt-out allowed by settings)",
            id="workload-label",
        ),
        pytest.param(_owned_replica_set(), "a Deployment's ReplicaSet: its template is the Deployment's", id="rs"),
        pytest.param(
            _created_by("bob", _refused_deployment({}, {}), old=_refused_deployment({}, {})),
            "the update leaves the pod template as it was",
            id="update-keeps-template",
        ),
    ],
)
def test_a_workload_passed_over_for_a_reason_of_its_own_has_its_pods_reviewed(
    tmp_path: Path, review: dict[str, Any], skipped: str
) -> None:
    """Its pods are made by its controller, without its own labels, from its template as it stands: the webhook
    reviews each. Such a workload said ADMITTED, podsAllowed true, where every pod would be refused."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"users": ["ci-deployer"], "allowOptOutLabel": True}}))
    path = _manifest(tmp_path, review)
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1, run.stdout
    kind = "ReplicaSet" if review["kind"] == "ReplicaSet" else "Deployment"
    assert run.stdout.startswith(f"PODS DENIED\nthe webhook passes the {kind} itself over ({skipped}"), run.stdout
    assert f"), but would refuse each pod it makes, as the pod is created:\n- {TOO_LARGE}\n" in run.stdout
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "-o", "json")
    assert run.returncode == 1, run.stdout
    out = json.loads(run.stdout)
    assert (out["allowed"], out["podsAllowed"], out["podsRefused"], out["patch"]) == (True, False, [TOO_LARGE], [])


def test_an_exempt_users_workload_whose_pods_pass_says_they_are_reviewed(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"users": ["ci-deployer"]}}))
    review = _created_by("ci-deployer", _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "20Gi"}))
    run = cli("review", "-f", _manifest(tmp_path, review), "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 0, run.stdout
    assert run.stdout == (
        "ADMITTED (user ci-deployer is exempt)\nits pods are reviewed each as it is created, and would be admitted\n"
    )


def test_a_workload_whose_pods_reach_a_gpu_tainted_pool_is_judged_as_they_are(tmp_path: Path) -> None:
    """Without the h100-mixed node, only the spot pool inference (L4, driver 560, each node tainted nvidia.com/gpu)
    runs CUDA 12.6. With mig.fallback whole each pod asks nvidia.com/gpu, tolerates that taint and is steered there;
    the template, judged as it asks (a gpu-memory size, no toleration), was said to have each pod denied: PODS
    DENIED, exit 1."""
    nodes = yaml.safe_load(NODES.read_text())
    nodes["items"] = [n for n in nodes["items"] if n["metadata"]["name"] != "ip-10-0-42-17.us-west-2.compute.internal"]
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text(yaml.safe_dump(nodes))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mig": {"fallback": "whole"}}))
    limits = {"gpu-admission.io/gpu-memory": "20Gi"}
    image = "nvidia/cuda:12.6.0-runtime-ubuntu22.04"
    given = ["--nodes", str(nodes_file), "--config", str(config), "-o", "json"]
    pod = cli("review", "-f", _manifest(tmp_path, _pod(image, limits)), *given)
    assert pod.returncode == 0, pod.stdout
    steered = "cuda: only spot pools run its CUDA, steered there (it may be preempted): pool inference"
    assert steered in json.loads(pod.stdout)["warnings"]
    run = cli("review", "-f", _manifest(tmp_path, _deployment("d", image, limits)), *given)
    assert run.returncode == 0, run.stdout
    out = json.loads(run.stdout)
    assert (out["allowed"], out["podsAllowed"]) == (True, True)
    whole = "its pods get nvidia.com/gpu 1 (whole GPU: no MIG profile covers it)"
    assert out["warnings"] == [f"main: gpu-admission.io/gpu-memory 20Gi: {whole}"]


@pytest.mark.parametrize(
    ("settings", "user", "why"),
    [
        pytest.param(
            {"exemptions": {"users": ["ci-deployer"]}}, "ci-deployer", "the webhook passes it over", id="exempt"
        ),
        pytest.param({"mig": {"enabled": False}}, "bob", "the webhook admits it unconverted", id="mig-off"),
    ],
)
def test_a_fraction_the_webhook_leaves_in_a_workload_is_refused_by_the_api_server(
    tmp_path: Path, settings: dict[str, Any], user: str, why: str
) -> None:
    """The API server takes only whole numbers of an extended resource, in a workload's pod template too
    (reference/mig.md §3): a 0.5 the webhook leaves as it is refuses the workload. An exempt user's was reviewed as
    if the webhook had converted it, and said ADMITTED, its pods admitted, exit 0."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    review = _created_by(user, _deployment("d", CUDA124, {"nvidia.com/gpu": "0.5"}))
    path = _manifest(tmp_path, review)
    refused = (
        "container main: nvidia.com/gpu 0.5: the API server refuses the Deployment, as an extended resource must be a"
        f" whole number ({why}"
    )
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1, run.stdout
    assert run.stdout.startswith(f"DENIED by the API server\n- {refused}"), run.stdout
    assert "ask for a whole number of GPUs or a MIG device (nvidia.com/mig-<profile>: 1)" in run.stdout
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "-o", "json")
    assert run.returncode == 1, run.stdout
    out = json.loads(run.stdout)
    assert out["allowed"] and "podsAllowed" not in out, out  # the webhook's answer; no pods are made
    assert [r.startswith(refused) for r in out["apiServerRefuses"]] == [True], out["apiServerRefuses"]


def test_an_exempt_users_workload_says_what_its_pods_get(tmp_path: Path) -> None:
    """The README says review prints what the pods of a workload passed over get: the second review's warnings (the
    fallback's whole GPU) were printed nowhere, in text or in -o json."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"users": ["ci-deployer"]}, "mig": {"fallback": "whole"}}))
    review = _created_by("ci-deployer", _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "60Gi"}))
    path = _manifest(tmp_path, review)
    whole = (
        "main: gpu-admission.io/gpu-memory 60Gi: its pods get nvidia.com/gpu 1 (whole GPU: no MIG profile covers it)"
    )
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 0, run.stdout
    assert run.stdout == (
        "ADMITTED (user ci-deployer is exempt)\nits pods are reviewed each as it is created, and would be admitted\n"
        f"Warning (its pods): {whole}\n"
    )
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "-o", "json")
    out = json.loads(run.stdout)
    assert (out["warnings"], out["podsAllowed"], out["podsWarnings"]) == ([], True, [whole]), out


def test_a_workload_whose_fallback_gpu_runs_no_driver_of_its_cuda_is_not_told_to_ask_for_less(tmp_path: Path) -> None:
    """With mig.fallback whole, each pod of a CUDA 13 image's 60Gi gets a whole GPU and is refused for its CUDA; its
    workload was told 'largest offered is 3g.40gb; ask for less', advice that changes nothing."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mig": {"fallback": "whole"}}))
    limits = {"gpu-admission.io/gpu-memory": "60Gi"}
    given = ["--nodes", str(NODES), "--config", str(config), "-o", "json"]
    pod = cli("review", "-f", _manifest(tmp_path, _pod(CUDA13, limits)), *given)
    out = json.loads(pod.stdout)
    assert (pod.returncode, out["allowed"]) == (1, False) and "needs CUDA 13.0" in out["message"], out["message"]
    whole = "main: gpu-admission.io/gpu-memory 60Gi -> nvidia.com/gpu 1 (whole GPU: no MIG profile covers it)"
    assert whole in out["warnings"]
    run = cli("review", "-f", _manifest(tmp_path, _deployment("d", CUDA13, limits)), *given)
    assert run.returncode == 1, run.stdout
    refused = json.loads(run.stdout)["podsRefused"]
    assert refused[0].startswith(
        "main: gpu-admission.io/gpu-memory 60Gi: its pods are refused: only a driver too old for their CUDA offers it ("
    ), refused
    assert not any("ask for less" in r for r in refused), refused


def _tainted_gpu_nodes(tmp_path: Path, product: str | None) -> str:
    """examples/nodes.yaml with the GPU nodes of ``product`` (every GPU node where None) tainted nvidia.com/gpu, as
    the GPU Operator's or a cloud's GPU pools are."""
    nodes = yaml.safe_load(NODES.read_text())
    for node in nodes["items"]:
        labels = node["metadata"].get("labels", {})
        if "nvidia.com/gpu" in node.get("status", {}).get("allocatable", {}) and product in (
            None,
            labels.get("nvidia.com/gpu.product"),
        ):
            taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
            node.setdefault("spec", {}).setdefault("taints", []).append(taint)
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(nodes))
    return str(path)


@pytest.mark.parametrize(
    ("image", "tainted", "verdict"),
    [
        # its only pools that run CUDA 12.4 are tainted: each pod is denied, as it gets no device that tolerates it
        pytest.param(CUDA124, "NVIDIA-H100-80GB-HBM3", "PODS DENIED", id="pods-denied"),
        # every GPU node tainted: no pool its pods reach, each pod admitted unchecked, and Pending for good
        pytest.param("pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime", None, "PODS PENDING", id="pods-unchecked"),
    ],
)
def test_a_workload_with_mig_off_is_judged_without_the_gpu_taint_its_pods_never_tolerate(
    tmp_path: Path, image: str, tainted: str | None, verdict: str
) -> None:
    """With mig.enabled false no pod gets a GPU device for its gpu-memory ask, nor the toleration of the GPU's taint
    a device brings: the workload was judged as if each pod tolerated it, and review's exit flipped both ways
    against what its pods got (a review's finding). Pods it admits stay Pending: no node offers the memory."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mig": {"enabled": False}}))
    nodes = _tainted_gpu_nodes(tmp_path, tainted)
    deployment = _deployment("d", image, {"gpu-admission.io/gpu-memory": "20Gi"})
    run = cli("review", "-f", _manifest(tmp_path, deployment), "--nodes", nodes, "--config", str(config))
    assert run.returncode == 1 and run.stdout.startswith(f"{verdict}\n"), run.stdout


@pytest.mark.parametrize(
    ("resources", "refused"),
    [
        pytest.param(
            {"requests": {"nvidia.com/gpu": "0.5"}, "limits": {"nvidia.com/gpu": "1"}},
            "nvidia.com/gpu 0.5: the API server refuses the Pod, as an extended resource must be a whole number",
            id="fraction-request-whole-limit",
        ),
        pytest.param(
            {"requests": {"nvidia.com/gpu": "1"}},
            "nvidia.com/gpu requests 1 with no limit: the API server refuses the Pod, as a request of a resource that"
            " cannot be overcommitted (an extended resource, hugepages) must equal its limit",
            id="request-without-limit",
        ),
        pytest.param(
            {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
            "nvidia.com/gpu requests 1 with its limit 2: the API server refuses the Pod",
            id="request-below-limit",
        ),
        pytest.param(
            {"requests": {"hugepages-2Mi": "2Mi", "memory": "1Gi"}},  # memory may be overcommitted, hugepages not
            "hugepages-2Mi requests 2Mi with no limit: the API server refuses the Pod",
            id="hugepages-without-limit",
        ),
        pytest.param(
            {"limits": {"example.com/foo": "0.5"}},
            "example.com/foo 0.5: the API server refuses the Pod, as an extended resource must be a whole number"
            " (the webhook admits it unconverted); ask for a whole number of it",
            id="another-resource",
        ),
    ],
)
def test_what_the_api_server_refuses_in_an_extended_resource_is_said(
    tmp_path: Path, resources: dict[str, Any], refused: str
) -> None:
    """A whole limit hid a 0.5 request (requests and limits were merged), a request without its limit or unequal to
    it passed (ValidateResourceRequirements refuses both for an extended resource, reference/mig.md §3), and a
    fraction of another resource was told to ask for GPUs (found by a review)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mig": {"enabled": False}}))
    pod = _pod(CUDA124, {})
    pod["spec"]["containers"][0]["resources"] = resources
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1, run.stdout
    assert run.stdout.startswith(f"DENIED by the API server\n- container main: {refused}"), run.stdout
    gpu_advice = "ask for a whole number of GPUs or a MIG device"
    assert (gpu_advice in run.stdout) == ("must be a whole number" in refused and "nvidia.com/" in refused), run.stdout


def test_review_prints_every_warning_whole_where_the_server_cuts_them(tmp_path: Path) -> None:
    """The server's answer keeps to the apiserver's room for warnings and says "gpu-admission review shows them
    all": review cut them as the server does, the same count of "more warnings not shown" (found by a review)."""
    pod = _pod(CUDA124, {"nvidia.com/gpu": "1"})
    keys = [f"gpu-admission.io/cuda-version-typo-{i}" for i in range(100)]
    pod["metadata"]["annotations"] = dict.fromkeys(keys, "12.4")
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json")
    assert run.returncode == 0, run.stdout
    warnings = json.loads(run.stdout)["warnings"]
    assert not any("not shown" in w for w in warnings), warnings
    assert all(any(key in w for w in warnings) for key in keys), warnings  # each whole, its key named in full
    assert sum(map(len, warnings)) > pipeline.WARNINGS_TOTAL  # more than an answer holds


LONG_KEY = "gpu-admission.io/cuda-version-for-the-trainer-container-of-the-nightly-build-" + "x" * 60
MISPLACED_KEY = "gpu-admission.io/cuda-version.trainer-of-the-nightly-build-on-the-h100-pool"


def _misplaced_on_deployment() -> tuple[dict[str, Any], str]:
    deployment = _deployment("d", CUDA124, {"nvidia.com/gpu": "1"})
    deployment["metadata"]["annotations"] = {MISPLACED_KEY: "12.4"}
    return deployment, f"{MISPLACED_KEY} is on the Deployment, not its pod template"


def _misspelt_on_pod() -> tuple[dict[str, Any], str]:
    pod = _pod(CUDA124, {"nvidia.com/gpu": "1"})
    pod["metadata"]["annotations"] = {LONG_KEY: "12.4"}
    return pod, f"{LONG_KEY} taken off: no gpu-admission key"


def _misspelt_by_pod_update() -> tuple[dict[str, Any], str]:
    old = _pod(CUDA124, {"nvidia.com/gpu": "1"})
    pod = _pod(CUDA124, {"nvidia.com/gpu": "1"})
    pod["metadata"]["annotations"] = {LONG_KEY: "12.4"}
    review = _admission_review(pod, operation="UPDATE")
    review["request"]["oldObject"] = old
    return review, f"{LONG_KEY} taken off: no gpu-admission key"


@pytest.mark.parametrize(
    "made",
    [
        pytest.param(_misplaced_on_deployment, id="misplaced"),
        pytest.param(_misspelt_on_pod, id="unknown-key"),
        pytest.param(_misspelt_by_pod_update, id="pod-update"),
    ],
)
def test_review_prints_a_warning_of_a_long_key_whole(tmp_path: Path, made: Any) -> None:
    """The warnings built apart from the policies' (an annotation on the workload and not its template, a key no
    gpu-admission key, one a pod update brings) were cut to a line in review too, the key named cut short; the
    server's answer still keeps each to a line."""
    obj, said = made()
    run = cli("review", "-f", _manifest(tmp_path, obj), "--nodes", str(NODES), "--config", str(CONFIG), "-o", "json")
    assert run.returncode == 0, run.stdout
    warnings = json.loads(run.stdout)["warnings"]
    whole = [w for w in warnings if w.startswith(said) and not w.endswith("…")]
    assert whole and len(whole[0]) > WARNING_LIMIT, warnings  # longer than a line: not cut
    request = obj.get("request", {})
    settings = webhook_cli._settings(str(CONFIG))
    ctx = Context(
        settings=settings,
        cluster=webhook_cli.load_nodes(str(NODES), settings),
        namespace="ml",
        operation=request.get("operation", "CREATE"),
        old_object=request.get("oldObject"),
    )
    answer = pipeline.mutate(request.get("object", obj), ctx)
    assert answer.warnings and all(len(w) <= WARNING_LIMIT for w in answer.warnings), answer.warnings


def _memory_deployment(template_labels: dict[str, str]) -> dict[str, Any]:
    """A Deployment asking a GPU memory size, converted on each pod, and a nvidia.com/gpu fraction, converted on
    its template."""
    deployment = _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "20Gi"})
    sidecar = {"name": "side", "image": CUDA124, "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}
    deployment["spec"]["template"]["spec"]["containers"].append(sidecar)
    deployment["spec"]["template"]["metadata"]["labels"].update(template_labels)
    return deployment


GROUP_EXEMPT = {"exemptions": {"groups": ["system:serviceaccounts:kube-system"]}}
CREATOR_IN_GROUP = f"exemptions.groups has system:serviceaccounts:kube-system, a group of their creator {RS_CONTROLLER}"
ASK_FRACTION = (
    "ask a nvidia.com/gpu fraction or nvidia.com/mig-<profile>: 1; or let them be reviewed: they pass untouched"
)
ASK_WHOLE = "ask a whole nvidia.com/gpu or nvidia.com/mig-<profile>: 1; "


def _fraction_deployment() -> dict[str, Any]:
    """A Deployment asking a GPU fraction by the annotation, converted on each pod as it is created."""
    deployment = _deployment("d", CUDA124, {})
    deployment["spec"]["template"]["metadata"]["annotations"] = {"gpu-admission.io/gpu-fraction": "0.25"}
    return deployment


@pytest.mark.parametrize(
    ("manifest", "settings", "verdict", "said"),
    [
        pytest.param(
            _memory_deployment(OPT_OUT),
            {"exemptions": {"allowOptOutLabel": True}},
            "PODS PENDING",
            f"main: its pods stay Pending, gpu-memory 20Gi unconverted: {ASK_FRACTION} (label"
            " gpu-admission.io/ignore=true on its pod template); no node offers gpu-admission.io/gpu-memory",
            id="template-opts-out",
        ),
        pytest.param(
            _created_by("ci-deployer", _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "20Gi"})),
            {"exemptions": {"users": ["ci-deployer", RS_CONTROLLER]}},
            "PODS PENDING",
            f"main: its pods stay Pending, gpu-memory 20Gi unconverted: {ASK_WHOLE}or let them be reviewed: they pass"
            f" untouched (exemptions.users has {RS_CONTROLLER}, their creator)",
            id="passed-over-and-its-pods-too",
        ),
        # with MIG conversion off a fraction is refused by the API server, and a review converts nothing
        pytest.param(
            _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "20Gi"}),
            {**GROUP_EXEMPT, "mig": {"enabled": False}},
            "PODS PENDING",
            f"main: its pods stay Pending, gpu-memory 20Gi unconverted: {ASK_WHOLE}they pass untouched"
            f" ({CREATOR_IN_GROUP}); no node offers gpu-admission.io/gpu-memory",
            id="mig-off",
        ),
        pytest.param(
            _fraction_deployment(),
            GROUP_EXEMPT,
            "PODS GET NO GPU",
            f"main: its pods get no GPU, gpu-fraction 0.25 unconverted: {ASK_FRACTION} ({CREATOR_IN_GROUP})",
            id="fraction-annotation",
        ),
    ],
)
def test_a_workload_whose_pods_pass_with_a_gpu_left_to_them_is_told_they_stay_pending_or_get_none(
    tmp_path: Path, manifest: dict[str, Any], settings: dict[str, Any], verdict: str, said: str
) -> None:
    """Its pods' gpu-memory or gpu-fraction annotation, converted on each pod as it is created, is never converted
    where they pass untouched: they stay Pending (no node offers the memory resource), or run with no GPU. Found by
    reviews: the template was admitted without a word of the annotation, review said ADMITTED and exited 0 (a CI
    gate passed it), the advice with MIG off was a fraction, which the API server refuses, and the template was
    annotated that its pods are checked as they are created."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    path = _manifest(tmp_path, manifest)
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1 and run.stdout.startswith(f"{verdict}\n"), run.stdout
    assert f"\n- {said}" in run.stdout and "its pods):" not in run.stdout, run.stdout  # said once, as why
    assert "checked on each pod" not in run.stdout, run.stdout  # no pod is
    out = json.loads(cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "-o", "json").stdout)
    assert (out["allowed"], out["podsAllowed"], out["podsRefused"]) == (True, True, []), out
    pending = [w for w in out["podsPending"] if w.startswith(said)]
    no_gpu = [w for w in out["podsWithoutGpu"] if w.startswith(said)]
    assert (len(pending), len(no_gpu)) == ((1, 0) if verdict == "PODS PENDING" else (0, 1)), out


@pytest.mark.parametrize(
    ("manifest", "settings", "remedy", "why"),
    [
        pytest.param(
            _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "900Gi"}),
            GROUP_EXEMPT,
            "main: its pods stay Pending, gpu-memory 900Gi unconverted: ask a nvidia.com/gpu fraction or"
            " nvidia.com/mig-<profile>: 1",
            "its pods pass untouched, none refused (exemptions.groups has system:serviceaccounts:kube-system",
            id="memory-creator-in-group",
        ),
        pytest.param(
            _fraction_deployment(),
            {"exemptions": {"users": [RS_CONTROLLER]}},
            "main: its pods get no GPU, gpu-fraction 0.25 unconverted: ask a nvidia.com/gpu fraction or"
            " nvidia.com/mig-<profile>: 1",
            "",
            id="fraction-creator-exempt",
        ),
    ],
)
def test_the_servers_warning_of_pods_passed_untouched_says_what_to_change_within_a_line(
    tmp_path: Path, manifest: dict[str, Any], settings: dict[str, Any], remedy: str, why: str
) -> None:
    """The apiserver's answer keeps each warning to a line: the remedy, and the setting that passes them, come
    within it (found by a review: '... ask a nvidi…', '... is in exempt group system:serv…'); the audit annotation
    has the whole. The template is not annotated that its pods are checked as they are created: none is."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    loaded = webhook_cli._settings(str(config))
    ctx = Context(settings=loaded, cluster=webhook_cli.load_nodes(str(NODES), loaded), namespace="ml")
    answer = pipeline.mutate(manifest, ctx)
    assert answer.allowed and all(len(w) <= WARNING_LIMIT for w in answer.warnings), answer.warnings
    assert [w for w in answer.warnings if w.startswith((remedy, why or remedy))], answer.warnings
    assert answer.audit["pods-untouched"].startswith(remedy) and "they pass untouched" in answer.audit["pods-untouched"]
    template = answer.object["spec"]["template"]["metadata"]
    assert "gpu-admission.io/cuda" not in template.get("annotations", {}), template


def test_pods_passed_untouched_whose_fraction_annotation_targets_a_container_asking_a_gpu_get_that_gpu(
    tmp_path: Path,
) -> None:
    """The container the gpu-fraction annotation names asks a whole GPU of its own: its pods, passed untouched, get
    it (found by a review: PODS GET NO GPU, exit 1)."""
    deployment = _fraction_deployment()
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"namespaces": ["ml"]}}))
    run = cli("review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 0 and run.stdout.startswith("ADMITTED (namespace ml is exempt)\n"), run.stdout
    assert "no GPU" not in run.stdout, run.stdout


@pytest.mark.parametrize("limits", [{"nvidia.com/gpu": "0"}, {"nvidia.com/hostdev": "1"}], ids=["gpu-0", "hostdev"])
def test_pods_passed_untouched_whose_fraction_annotation_targets_a_container_asking_no_gpu_device_get_none(
    tmp_path: Path, limits: dict[str, str]
) -> None:
    """`nvidia.com/gpu: 0` (a chart's default) or the Network Operator's `nvidia.com/hostdev` asks no GPU: the
    container the gpu-fraction annotation names, passed untouched, gets none (found by a review: any nvidia.com/
    resource was taken for a GPU of its own, ADMITTED and exit 0, and its CUDA said unchecked)."""
    deployment = _fraction_deployment()
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": limits}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"namespaces": ["ml"]}}))
    run = cli("review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1 and "PODS GET NO GPU" in run.stdout, run.stdout
    assert "CUDA unchecked" not in run.stdout, run.stdout


def test_the_server_says_first_that_pods_passed_untouched_stay_pending_and_not_what_mig_profile_they_get(
    tmp_path: Path,
) -> None:
    """No MIG profile is chosen for pods that pass untouched: nothing is said of what they would get, and their
    Pending lines come first, within the warnings sent; the audit annotation holds whole lines, the rest counted
    (found by a review: 'its pods' nvidia.com/mig-1g.10gb has 9984 MiB usable' ten times pushed the Pending lines out
    of the count, and the annotation was cut mid-line)."""
    job = _deployment("j", CUDA124, {})
    job.update(kind="Job", apiVersion="batch/v1")
    job["spec"]["template"]["spec"]["containers"] = [
        {"name": f"w{i}", "image": CUDA124, "resources": {"limits": {"gpu-admission.io/gpu-memory": "10Gi"}}}
        for i in range(10)
    ]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"users": ["system:serviceaccount:kube-system:job-controller"]}}))
    loaded = webhook_cli._settings(str(config))
    ctx = Context(settings=loaded, cluster=webhook_cli.load_nodes(str(NODES), loaded), namespace="ml")
    answer = pipeline.mutate(job, ctx)
    assert not [w for w in answer.warnings if "its pods'" in w or "MiB usable" in w], answer.warnings
    assert answer.warnings[0].startswith("w0: its pods stay Pending"), answer.warnings
    whole = pipeline.mutate(job, dataclasses.replace(ctx, limited=False)).audit["pods-untouched"].splitlines()
    *lines, more = answer.audit["pods-untouched"].splitlines()
    assert len(whole) == 10 and lines == whole[: len(lines)], (lines, whole)
    assert more == f"{10 - len(lines)} more, not shown: gpu-admission review shows them all", more


def test_pods_passed_untouched_are_told_the_cuda_of_their_whole_gpu_container_is_unchecked(tmp_path: Path) -> None:
    """The gpu-fraction annotation on a sidecar leaves the template's CUDA check to each pod; where the pods pass
    untouched, the check of the container asking a whole GPU of its own is done nowhere, and said so (found by a
    review: the check's line was dropped without a word)."""
    deployment = _fraction_deployment()
    deployment["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/gpu-fraction-container"] = "side"
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    deployment["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": CUDA124})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(GROUP_EXEMPT))
    run = cli("review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1 and run.stdout.startswith("PODS GET NO GPU\n"), run.stdout
    unchecked = "main: CUDA unchecked: let its pods be reviewed, or ask no gpu-memory or gpu-fraction"
    assert f"\nWarning: {unchecked}" in run.stdout and f"({CREATOR_IN_GROUP})\n" in run.stdout, run.stdout
    assert "side: CUDA" not in run.stdout, run.stdout  # it gets no GPU, said above


def _cron_job(template_metadata: dict[str, Any] | None) -> dict[str, Any]:
    """A CronJob asking a GPU memory size, its job's pod template with ``template_metadata`` (None: none)."""
    template = {"spec": {**_pod(CUDA124, {"gpu-admission.io/gpu-memory": "20Gi"})["spec"], "restartPolicy": "Never"}}
    if template_metadata is not None:
        template["metadata"] = template_metadata
    job = {"template": template}
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "cj", "namespace": "ml"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": job}},
    }


def _fraction_pod() -> dict[str, Any]:
    """A Pod asking a GPU fraction by the annotation."""
    pod = _pod(CUDA124, {})
    pod["metadata"]["annotations"] = {"gpu-admission.io/gpu-fraction": "0.25"}
    return pod


MEMORY = {"gpu-admission.io/gpu-memory": "20Gi"}
MIG_OFF = {"mig": {"enabled": False}, "exemptions": {"namespaces": ["kube-system"]}}
PENDING_MIG_OFF = (
    "main: {} Pending, gpu-memory 20Gi unconverted: ask a whole nvidia.com/gpu or nvidia.com/mig-<profile>: 1; MIG"
    " conversion is off here (mig.enabled: false); no node offers gpu-admission.io/gpu-memory"
)
NO_NODE = "; no node offers gpu-admission.io/gpu-memory"
POD_PASSED = "ask a whole nvidia.com/gpu or nvidia.com/mig-<profile>: 1; or let it be reviewed: it passes untouched"
PASSED_MIG_OFF = "ask a whole nvidia.com/gpu or nvidia.com/mig-<profile>: 1; it passes untouched"


@pytest.mark.parametrize(
    ("manifest", "settings", "namespace", "verdict", "key", "said"),
    [
        pytest.param(
            {**_deployment("j", CUDA124, MEMORY), "kind": "Job", "apiVersion": "batch/v1"},
            MIG_OFF,
            "ml",
            "PODS PENDING",
            "podsPending",
            PENDING_MIG_OFF.format("its pods stay"),
            id="mig-off-job",
        ),
        pytest.param(
            {**_deployment("s", CUDA124, MEMORY), "kind": "StatefulSet"},
            MIG_OFF,
            "ml",
            "PODS PENDING",
            "podsPending",
            PENDING_MIG_OFF.format("its pods stay"),
            id="mig-off-statefulset",
        ),
        pytest.param(
            _cron_job({}),
            MIG_OFF,
            "ml",
            "PODS PENDING",
            "podsPending",
            PENDING_MIG_OFF.format("its pods stay"),
            id="mig-off-cronjob",
        ),
        pytest.param(
            _pod(CUDA124, MEMORY),
            MIG_OFF,
            "ml",
            "PENDING",
            "podsPending",
            PENDING_MIG_OFF.format("the pod stays"),
            id="mig-off-pod",
        ),
        pytest.param(
            _pod(CUDA124, MEMORY),
            MIG_OFF,
            "kube-system",
            "PENDING",
            "podsPending",
            f"main: the pod stays Pending, gpu-memory 20Gi unconverted: {PASSED_MIG_OFF}"
            f" (namespace kube-system is exempt){NO_NODE}",
            id="mig-off-pod-exempt",
        ),
        pytest.param(
            _pod(CUDA124, MEMORY),
            {"exemptions": {"namespaces": ["kube-system"]}},
            "kube-system",
            "PENDING",
            "podsPending",
            f"main: the pod stays Pending, gpu-memory 20Gi unconverted: {POD_PASSED} (namespace kube-system is exempt)"
            + NO_NODE,
            id="pod-exempt-memory",
        ),
        pytest.param(
            _fraction_pod(),
            {"exemptions": {"namespaces": ["kube-system"]}},
            "kube-system",
            "GETS NO GPU",
            "podsWithoutGpu",
            f"main: the pod gets no GPU, gpu-fraction 0.25 unconverted: {POD_PASSED} (namespace kube-system is exempt)",
            id="pod-exempt-fraction",
        ),
    ],
)
def test_a_pod_or_workload_whose_gpu_ask_is_never_converted_is_said_to_stay_pending_or_get_no_gpu(
    tmp_path: Path,
    manifest: dict[str, Any],
    settings: dict[str, Any],
    namespace: str,
    verdict: str,
    key: str,
    said: str,
) -> None:
    """With mig.enabled false, or a Pod passed untouched, its gpu-memory size or gpu-fraction annotation is never
    converted: the pods stay Pending (no node offers the memory) or get no GPU. A Pod's verdict is its workload's
    of one pod (PENDING, PODS PENDING), exit 1; the template is not annotated that each pod's MIG profile is chosen
    as it is created (found by reviews: ADMITTED, exit 0, where the same pods of a workload passed untouched said
    PODS PENDING)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    path = _manifest(tmp_path, manifest)
    given = ("--nodes", str(NODES), "--config", str(config), "--namespace", namespace)
    run = cli("review", "-f", path, *given)
    assert run.returncode == 1 and run.stdout.startswith(f"{verdict}\n"), run.stdout
    assert f"\n- {said}" in run.stdout and "chosen then" not in run.stdout, run.stdout
    out = json.loads(cli("review", "-f", path, *given, "-o", "json").stdout)
    assert out["allowed"] and out[key] == [said], out


def test_a_template_without_metadata_whose_pods_pass_untouched_gets_no_empty_patch(tmp_path: Path) -> None:
    """The metadata made to hold the webhook's annotations is dropped where none is written (the CUDA line is not,
    where the pods pass untouched): the answer is the one a template with empty metadata gets (found by a review:
    a patch adding an empty map, audited 'annotated')."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(GROUP_EXEMPT))
    loaded = webhook_cli._settings(str(config))
    ctx = Context(settings=loaded, cluster=webhook_cli.load_nodes(str(NODES), loaded), namespace="ml")
    bare, empty = pipeline.mutate(_cron_job(None), ctx), pipeline.mutate(_cron_job({}), ctx)
    assert bare.allowed and bare.patch == empty.patch == [], bare.patch
    assert bare.audit == empty.audit and "decision" not in bare.audit, bare.audit
    assert "pods-untouched" in bare.audit, bare.audit


@pytest.mark.parametrize(
    "resources",
    [
        pytest.param({"limits": {"gpu-admission.io/gpu-memory": [1, 2]}}, id="not-a-quantity"),
        pytest.param({"requests": {"gpu-admission.io/gpu-memory": "20Gi"}}, id="requests-only"),
    ],
)
def test_a_denied_workload_whose_pods_would_pass_untouched_is_not_told_they_stay_pending(
    tmp_path: Path, resources: dict[str, Any]
) -> None:
    """No pods are made of a workload the webhook denies: no word of them staying Pending (found by a review)."""
    deployment = _deployment("d", CUDA124, {})
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(GROUP_EXEMPT))
    run = cli("review", "-f", _manifest(tmp_path, deployment), "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1 and run.stdout.startswith("DENIED\n"), run.stdout
    assert "Pending" not in run.stdout, run.stdout


def test_review_escapes_the_control_characters_of_the_names_it_prints(tmp_path: Path) -> None:
    """A name's newline or escape sequence is printed escaped: in a stream's header (a generateName forged a
    '== Pod' line), on stderr (a bell), and in the lines of why its pods stay Pending (a container's name). An
    AdmissionReview's object is named in its request's namespace, the one it is reviewed in, on stderr as in its
    header (the object's own came first there)."""
    deployment = _deployment("d", CUDA124, {"gpu-admission.io/gpu-memory": "20Gi"})
    deployment["metadata"] = {"generateName": "gen-\x1b[31m\n== Pod x/y (forged)", "namespace": "other"}
    deployment["spec"]["template"]["spec"]["containers"][0]["name"] = "main\nWarning: forged\x1b[2K"
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc\x07bell", "namespace": "other"}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(GROUP_EXEMPT))
    path = _stream(tmp_path, [_admission_review(deployment), _admission_review(service)])
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1, run.stdout + run.stderr
    assert not any(c in run.stdout + run.stderr for c in "\x1b\x07"), (run.stdout, run.stderr)
    lines = run.stdout.splitlines()
    assert lines[0] == (
        f"== Deployment ml/gen-\\x1b[31m\\n== Pod x/y (forged) ({path}: document 1, in an AdmissionReview)"
    ), run.stdout
    assert [line for line in lines if line.startswith("== ")] == lines[:1], run.stdout
    assert "\n- main\\nWarning: forged\\x1b[2K: its pods stay Pending" in run.stdout, run.stdout
    assert f"{path}: document 2 (Service ml/svc\\x07bell in an AdmissionReview)" in run.stderr, run.stderr


@pytest.mark.parametrize(
    ("image", "limits", "verdict"),
    [
        pytest.param(CUDA13, {"nvidia.com/gpu": "1"}, "DENIED", id="message"),
        pytest.param(CUDA124, {"nvidia.com/gpu": "0.5"}, "ADMITTED", id="annotations"),
    ],
)
def test_review_escapes_the_control_characters_of_its_message_and_annotations(
    tmp_path: Path, image: str, limits: dict[str, str], verdict: str
) -> None:
    """A container's name with an escape sequence or bell reached the terminal through a denial's message and the
    gpu-admission.io/ annotations review prints, which were printed as they are (its warnings and verdicts' lines
    were escaped already)."""
    pod = _pod(image, limits)
    pod["spec"]["containers"][0]["name"] = "main\x1b[2K\x07\r"
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == (0 if verdict == "ADMITTED" else 1), run.stdout + run.stderr
    assert run.stdout.startswith(verdict + "\n"), run.stdout
    assert "main\\x1b[2K\\x07\\r" in run.stdout, run.stdout
    assert not any(c in run.stdout for c in "\x1b\x07\r"), run.stdout


@pytest.mark.parametrize(
    ("image", "limits", "verdict"),
    [
        pytest.param(CUDA13, {"nvidia.com/gpu": "1"}, "DENIED", id="message"),
        pytest.param(CUDA124, {"nvidia.com/gpu": "0.5"}, "ADMITTED", id="annotations"),
    ],
)
@pytest.mark.parametrize("control", ["\u202e", "\u2066", "\u061c", "\u200f"], ids=["rlo", "lri", "alm", "rlm"])
def test_review_prints_a_users_newline_and_bidi_controls_escaped_and_the_webhooks_own_lines_as_lines(
    tmp_path: Path, image: str, limits: dict[str, str], verdict: str, control: str
) -> None:
    """A container's name with a newline started a line of its own in a denial (a forged 'Warning:' line), and a
    bidirectional control reordered the terminal's line (Trojan Source); the cuda annotation's own lines were
    printed joined by a literal \\n."""
    pod = _pod(image, limits)
    pod["spec"]["containers"][0]["name"] = f"main\nWarning: forged{control}x"
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(CONFIG))
    assert run.returncode == (0 if verdict == "ADMITTED" else 1), run.stdout + run.stderr
    assert run.stdout.startswith(verdict + "\n"), run.stdout
    assert control not in run.stdout, run.stdout
    assert f"main\\nWarning: forged{repr(control)[1:-1]}x" in run.stdout, run.stdout
    assert not any(line.startswith("Warning: forged") for line in run.stdout.splitlines()), run.stdout
    if verdict == "ADMITTED":  # its container line, then its decision on a line of its own
        lines = run.stdout.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("gpu-admission.io/cuda: "))
        assert lines[at].startswith("gpu-admission.io/cuda: main\\nWarning: forged"), run.stdout
        assert "decision:" not in lines[at] and lines[at + 1].startswith("  decision: admitted: "), run.stdout


def _owned_pod(kind: str, api_version: str) -> dict[str, Any]:
    """A Pod made by a controller: what `kubectl get pod -o yaml` prints of one (a CUDA no pool runs)."""
    pod = _pod(CUDA13, {"nvidia.com/gpu": "1"})
    owner = {"apiVersion": api_version, "kind": kind, "name": "w", "uid": "u", "controller": True}
    pod["metadata"]["ownerReferences"] = [owner]
    return pod


@pytest.mark.parametrize(
    ("kind", "api_version", "exemptions", "creator"),
    [
        pytest.param("ReplicaSet", "apps/v1", {"users": [RS_CONTROLLER]}, RS_CONTROLLER, id="replicaset-user"),
        pytest.param(
            "Job",
            "batch/v1",
            {"groups": ["system:serviceaccounts:kube-system"]},
            "system:serviceaccount:kube-system:job-controller",
            id="job-group",
        ),
        pytest.param(
            "StatefulSet",
            "apps/v1",
            {"users": ["system:serviceaccount:kube-system:statefulset-controller"]},
            "system:serviceaccount:kube-system:statefulset-controller",
            id="statefulset",
        ),
        pytest.param(
            "DaemonSet",
            "apps/v1",
            {"users": ["system:serviceaccount:kube-system:daemon-set-controller"]},
            "system:serviceaccount:kube-system:daemon-set-controller",
            id="daemonset",
        ),
        pytest.param(
            "ReplicationController",
            "v1",
            {"users": ["system:serviceaccount:kube-system:replication-controller"]},
            "system:serviceaccount:kube-system:replication-controller",
            id="replicationcontroller",
        ),
    ],
)
def test_a_pod_of_a_built_in_controller_is_reviewed_as_its_controllers_creation(
    tmp_path: Path, kind: str, api_version: str, exemptions: dict[str, Any], creator: str
) -> None:
    """In a cluster, the controller creates the pod, as its own user: an exemption of that user or its group
    applies. Such a Pod was reviewed as created by whoever ran review, and refused."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": exemptions}))
    path = _manifest(tmp_path, _owned_pod(kind, api_version))
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ADMITTED (") and " is exempt)\n" in run.stdout, run.stdout
    said = f"reviewed as created by {creator}, as its controller {kind} w creates it in a cluster"
    assert said in run.stdout, run.stdout
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "-o", "json")
    out = json.loads(run.stdout)
    assert (out["allowed"], out["createdBy"]) == (True, creator), out


@pytest.mark.parametrize(
    ("owner", "exemptions"),
    [
        pytest.param(
            {"kind": "Job", "apiVersion": "batch.volcano.sh/v1alpha1"},
            {"users": ["system:serviceaccount:kube-system:job-controller"]},
            id="volcano-job",
        ),
        pytest.param({"kind": "ReplicaSet", "apiVersion": "apps/v1", "controller": False}, {}, id="not-controller"),
    ],
)
def test_a_pod_of_another_owner_is_reviewed_as_written(
    tmp_path: Path, owner: dict[str, Any], exemptions: dict[str, Any]
) -> None:
    """Only a built-in controller's pods are its creation: a Volcano Job's (batch.volcano.sh) are made by Volcano."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"users": [RS_CONTROLLER], **exemptions}}))
    pod = _owned_pod(owner["kind"], owner["apiVersion"])
    pod["metadata"]["ownerReferences"][0].update(owner)
    run = cli("review", "-f", _manifest(tmp_path, pod), "--nodes", str(NODES), "--config", str(config), "-o", "json")
    assert run.returncode == 1, run.stdout + run.stderr
    out = json.loads(run.stdout)
    assert out["allowed"] is False and "createdBy" not in out, out


@pytest.mark.parametrize(
    ("settings", "namespace", "why"),
    [
        pytest.param({"mig": {"enabled": False}}, "ml", "MIG conversion is off here", id="mig-off"),
        pytest.param({"exemptions": {"namespaces": ["ml"]}}, "ml", "it passes untouched (namespace ml", id="exempt"),
    ],
)
def test_a_pod_asking_a_whole_gpu_and_a_gpu_memory_size_left_unconverted_is_told_to_drop_the_size(
    tmp_path: Path, settings: dict[str, Any], namespace: str, why: str
) -> None:
    """It was told to "ask a whole nvidia.com/gpu", which it asks already: what to change is the memory size; and to
    "let it be reviewed", where a review refuses it (a fraction or a memory size, not both)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    pod = _pod(CUDA124, {"nvidia.com/gpu": "1", "gpu-admission.io/gpu-memory": "20Gi"})
    path = _manifest(tmp_path, pod)
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "--namespace", namespace)
    assert run.returncode == 1 and run.stdout.startswith("PENDING\n"), run.stdout + run.stderr
    said = (
        "- main: the pod stays Pending, gpu-memory 20Gi unconverted: drop it, as it asks nvidia.com/gpu 1 too, or ask"
        " nvidia.com/mig-<profile>: 1 for both; "
    )
    assert said in run.stdout and why in run.stdout, run.stdout
    assert "a whole nvidia.com/gpu" not in run.stdout and "be reviewed" not in run.stdout, run.stdout
    reviewed = cli("review", "-f", path, "--nodes", str(NODES), "--namespace", namespace)
    assert reviewed.stdout.startswith("DENIED\n") and "not both" in reviewed.stdout, reviewed.stdout


@pytest.mark.parametrize(
    ("device", "both"),
    [
        pytest.param({"nvidia.com/gpu": "1"}, True, id="one-gpu"),
        pytest.param({"nvidia.com/gpu": "2"}, False, id="two-gpus"),
        pytest.param({"nvidia.com/mig-3g.40gb": "1"}, False, id="mig-device"),
        pytest.param({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}, False, id="two-devices"),
    ],
)
def test_a_container_asking_a_device_and_a_gpu_memory_size_is_told_a_mig_device_for_both_only_for_one_gpu(
    tmp_path: Path, device: dict[str, str], both: bool
) -> None:
    """One asking a MIG device was told to ask a MIG device for both, which it does; one asking two GPUs to take one
    MIG device for both, two GPUs cut to one slice. One asking two devices was told of the first alone (to drop the
    size, as it asks nvidia.com/gpu 1, or to take one MIG device for both), each device it asks named now."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"exemptions": {"namespaces": ["ml"]}}))
    path = _manifest(tmp_path, _pod(CUDA124, {**device, "gpu-admission.io/gpu-memory": "20Gi"}))
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config), "--namespace", "ml")
    assert run.returncode == 1 and run.stdout.startswith("PENDING\n"), run.stdout + run.stderr
    named = " and ".join(f"{name} {value}" for name, value in device.items())
    said = f"gpu-memory 20Gi unconverted: drop it, as it asks {named} too"
    said += ", or ask nvidia.com/mig-<profile>: 1 for both; " if both else "; it passes untouched (namespace ml"
    assert said in run.stdout, run.stdout
    assert ("for both" in run.stdout) is both, run.stdout


def _deployments_replica_set(limits: dict[str, str]) -> dict[str, Any]:
    replica_set = _deployment("d", CUDA124, limits)
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u", "controller": True}
    replica_set.update(kind="ReplicaSet", metadata={"name": "d-5f6d", "namespace": "ml", "ownerReferences": [owner]})
    return replica_set


PASSED_RS = "the webhook passes the ReplicaSet itself over (a Deployment's ReplicaSet: its template is the Deployment's"


@pytest.mark.parametrize(
    ("limits", "settings", "code", "said"),
    [
        pytest.param(
            {"gpu-admission.io/gpu-memory": "20Gi"},
            {},
            0,
            "ADMITTED (a Deployment's ReplicaSet: its template is the Deployment's, reviewed there)\n"
            "its pods are reviewed each as it is created, and would be admitted\n",
            id="pods-reviewed",
        ),
        pytest.param(
            {"gpu-admission.io/gpu-memory": "20Gi"},
            {"exemptions": {"users": [RS_CONTROLLER]}},
            1,
            f"PODS PENDING\n{PASSED_RS}, reviewed there), but its pods' GPU ask is never converted:\n- main: its pods"
            " stay Pending, gpu-memory 20Gi unconverted: ask a nvidia.com/gpu fraction or nvidia.com/mig-<profile>: 1;"
            f" or let them be reviewed: they pass untouched (exemptions.users has {RS_CONTROLLER}, their creator)",
            id="pods-pass-untouched",
        ),
        pytest.param(
            {"nvidia.com/gpu": "0.5"},
            {},
            1,
            "DENIED by the API server\n- container main: nvidia.com/gpu 0.5: the API server refuses the ReplicaSet, as"
            " an extended resource must be a whole number (the webhook passes over a Deployment's ReplicaSet, whose"
            " template the Deployment controller copies from the Deployment as stored: a Deployment asking this is"
            " converted by the webhook or refused (by the webhook, or by the API server where the webhook passes it"
            " over), so no Deployment the cluster took writes it; change it in the Deployment's manifest); ",
            id="fraction-left",
        ),
        pytest.param(
            {"nvidia.com/gpu": "0.5"},
            {"mig": {"enabled": False}},
            1,
            "DENIED by the API server\n- container main: nvidia.com/gpu 0.5: the API server refuses the ReplicaSet, as"
            " an extended resource must be a whole number (the webhook passes over a Deployment's ReplicaSet, and MIG"
            " conversion is off here (mig.enabled: false)); ask for a whole number of GPUs or a MIG device",
            id="fraction-left-mig-off",
        ),
    ],
)
def test_a_deployments_replica_set_is_said_one_thing_a_line(
    tmp_path: Path, limits: dict[str, str], settings: dict[str, Any], code: int, said: str
) -> None:
    """Its verdict said "its pods are reviewed as they are created" and then that they pass untouched; or that its
    template was reviewed at the Deployment, of a fraction left in it; it was told to ask a whole GPU where the
    Deployment was told to ask a fraction; and its pods were said to be reviewed twice over. With MIG off, a fraction
    left in it was said to be converted in the Deployment's template, which is admitted unconverted too."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    path = _manifest(tmp_path, _deployments_replica_set(limits))
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == code, run.stdout + run.stderr
    assert run.stdout.startswith(said), run.stdout
    assert "reviewed as they are created" not in run.stdout, run.stdout


@pytest.mark.parametrize(
    ("resources", "settings", "labels", "deployment"),
    [
        pytest.param(
            {"limits": {"nvidia.com/gpu": "0.5"}},
            {"exemptions": {"users": ["ci-deployer"]}},
            {},
            "the webhook passes it over, user ci-deployer is exempt",
            id="deployment-exempt",
        ),
        pytest.param(
            {"limits": {"nvidia.com/gpu": "0.5"}},
            {"exemptions": {"allowOptOutLabel": True}},
            {IGNORE_LABEL: "true"},
            f"the webhook passes it over, label {IGNORE_LABEL}=true",
            id="deployment-opted-out",
        ),
        pytest.param(
            {"requests": {"nvidia.com/gpu": "1"}}, {}, {}, "the webhook admits it unconverted", id="not-converted"
        ),
    ],
)
def test_a_deployments_replica_set_never_says_the_webhook_converts_what_the_deployment_was_left_with(
    tmp_path: Path, resources: dict[str, Any], settings: dict[str, Any], labels: dict[str, str], deployment: str
) -> None:
    """A Deployment's ReplicaSet that kept a fraction or a request without its limit was told 'it converts the
    Deployment's template, which the Deployment controller copies into the ReplicaSets it writes', where the
    Deployment was passed over (its creator exempt, its own opt-out label) or left it unconverted: the API server
    refuses such a Deployment (and the webhook converts one it does not pass over), so the ReplicaSet's template
    comes from no Deployment the cluster took, and review, which sees the ReplicaSet alone, says so."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    created = _deployment("d", CUDA124, {})
    created["metadata"]["labels"] = labels
    created["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
    path = _manifest(tmp_path, _created_by("ci-deployer", created))
    run = cli("review", "-f", path, "--nodes", str(NODES), "--config", str(config))
    assert run.returncode == 1 and run.stdout.startswith("DENIED by the API server\n"), run.stdout + run.stderr
    assert "the API server refuses the Deployment, as" in run.stdout and f"({deployment}" in run.stdout, run.stdout
    # what the Deployment controller writes: the Deployment's template, labelled as it is, owned by the Deployment
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u", "controller": True}
    metadata = {"name": "d-5f6d", "namespace": "ml", "labels": {"app": "d"}, "ownerReferences": [owner]}
    run = cli(
        "review",
        "-f",
        _manifest(tmp_path, {**created, "kind": "ReplicaSet", "metadata": metadata}),
        "--nodes",
        str(NODES),
        "--config",
        str(config),
    )
    assert run.returncode == 1 and run.stdout.startswith("DENIED by the API server\n"), run.stdout + run.stderr
    assert "converts the Deployment's template" not in run.stdout, run.stdout
    said = (
        "a Deployment asking this is converted by the webhook or refused (by the webhook, or by the API server where"
        " the webhook passes it over), so no Deployment the cluster took writes it; change it in the Deployment's"
        " manifest"
    )
    assert "the API server refuses the ReplicaSet, as" in run.stdout and said in run.stdout, run.stdout
