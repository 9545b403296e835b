"""The Dockerfile, checked statically (no Docker engine here): pinned slim base, non-root, read-only friendly,
entrypoint and default command agreeing with the chart and with pyproject's console script."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib

import pytest

from tests.test_chart import ROOT, find, render_values

DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments and the parser directive dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "dangling line continuation"
    return out


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {args}"
    return value


def env(stage: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for word, args in stage:
        if word == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", args):
                out[key] = value
    return out


def test_base_image_is_slim_and_pinned(steps):
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    froms = [a.split()[0] for w, a in steps if w == "FROM"]
    assert froms and all(f == "${PYTHON_IMAGE}" for f in froms)
    assert not any(":latest" in a for w, a in steps if w == "FROM")


def test_runs_as_numeric_non_root_user(steps):
    users = [a for w, a in final_stage(steps) if w == "USER"]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    # Matches the chart's securityContext (runAsUser), so runAsNonRoot can check it.
    spec = find(render_values("defaults"), "Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsUser"] == int(uid)


def test_read_only_root_filesystem_friendly(steps):
    values = env(final_stage(steps))
    assert values["PYTHONDONTWRITEBYTECODE"] == "1"
    assert values["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/")
    assert values["HOME"] == "/tmp"
    # Bytecode compiled at build time, since the container cannot write it.
    assert any(w == "RUN" and "compileall" in a for w, a in steps)


def test_entrypoint_and_default_command_agree_with_the_chart(steps):
    stage = final_stage(steps)
    (entrypoint,) = [exec_form(a) for w, a in stage if w == "ENTRYPOINT"]
    (cmd,) = [exec_form(a) for w, a in stage if w == "CMD"]
    assert entrypoint == ["gpu-admission"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gpu-admission"] == "webhook.cli:main"
    container = find(render_values("defaults"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    chart_args: list[str] = container["args"]
    assert cmd[0] == "serve"
    for flag in ("--config", "--cert", "--key", "--port", "--metrics-port"):
        assert cmd[cmd.index(flag) + 1] == chart_args[chart_args.index(flag) + 1], flag
    exposed = {int(p) for w, a in stage if w == "EXPOSE" for p in a.split()}
    assert exposed == {p["containerPort"] for p in container["ports"]}


def test_healthcheck_probes_healthz_over_https(steps):
    (check,) = [a for w, a in final_stage(steps) if w == "HEALTHCHECK"]
    assert "CMD" in check and "https://127.0.0.1:8443/healthz" in check


def test_no_remote_add_and_copies_exist(steps):
    assert not [a for w, a in steps if w == "ADD"], "use COPY (ADD fetches URLs and unpacks archives)"
    for word, args in steps:
        if word == "COPY" and not args.startswith("--from"):
            *sources, _ = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                assert not ignored(src), f"COPY {src}: excluded by .dockerignore"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    copied = {a.split()[0] for w, a in steps if w == "COPY" and not a.startswith("--from")}
    for pattern in packages["include"]:
        assert pattern.rstrip("*") in copied, f"package {pattern} is not copied into the build"


def ignored(path: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a pattern also matches everything below it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if pattern.startswith("**/"):  # at any depth
            matched = any(fnmatch.fnmatch(part, pattern[3:]) for part in parts)
        else:
            matched = any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes)
        if matched:
            result = not negate
    return result


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(".venv/bin/python", True, id="venv"),
        pytest.param(".tools/helm", True, id="tools"),
        pytest.param(".git/config", True, id="git"),
        pytest.param(".dev-certs/tls.key", True, id="dev-certs"),
        pytest.param("tests/test_chart.py", True, id="tests"),
        pytest.param("webhook/__pycache__/cli.cpython-311.pyc", True, id="bytecode"),
        pytest.param("webhook/cli.py", False, id="webhook-source"),
        pytest.param("webhook/data/cuda-driver.yaml", False, id="data-files"),
        pytest.param("pyproject.toml", False, id="pyproject"),
        pytest.param("README.md", False, id="readme"),
    ],
)
def test_dockerignore(path: str, expected: bool) -> None:
    assert ignored(path) is expected
