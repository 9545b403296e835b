"""The chart's values.schema.json: its `config` part is generated from webhook/config.py, and helm enforces it.

When a settings field is added to webhook/config.py, regenerate the schema's `config` part:
    .venv/bin/python -m tests.test_chart_schema --write
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from certs.issue import issue_ca
from tests.conftest import EXAMPLES
from tests.test_chart import (
    CHART,
    FULLNAME,
    VALUE_SETS,
    VALUES,
    _values_comment,
    certs_jobs,
    find,
    find_all,
    helm,
    hooks,
    render_values,
    template,
)
from webhook import cli as webhook_cli
from webhook import cluster as cluster_module
from webhook import config as settings_module
from webhook.errors import ConfigError, InputError

SCHEMA_PATH = CHART / "values.schema.json"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _field_docs(cls: type) -> dict[str, str]:
    """Field docstrings (the string literal after each annotated field) read from the source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in itertools.pairwise(body):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin in (types.UnionType, typing.Union):
        options = [a for a in get_args(tp) if a is not type(None)]
        inner = _type_schema(options[0])
        return {"anyOf": [inner, {"type": "null"}]}
    if origin is list:
        (item,) = get_args(tp)
        return {"type": "array", "items": _type_schema(item)}
    if origin is dict:
        _, item = get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(item)}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return dataclass_schema(tp)
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no schema for settings type {tp!r}")


def dataclass_schema(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    docs = _field_docs(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        prop = _type_schema(hints[f.name])
        prop.update(f.metadata.get("schema", {}))  # what the server refuses too (its __post_init__ checks)
        if f.name in docs:
            prop = {"description": docs[f.name], **prop}
        props[_camel(f.name)] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(_camel(f.name))
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if cls.__doc__:
        out = {"description": " ".join(cls.__doc__.split()), **out}
    if required:
        out["required"] = required
    return out


def config_schema() -> dict[str, Any]:
    schema = dataclass_schema(settings_module.Settings)
    schema["description"] = "Settings of the server (webhook/config.py), camelCase keys."
    return schema


def _strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip_descriptions(v) for v in node]
    return node


def test_config_schema_matches_settings_dataclasses():
    committed = json.loads(SCHEMA_PATH.read_text())["properties"]["config"]
    assert _strip_descriptions(committed) == _strip_descriptions(config_schema()), (
        "values.schema.json is out of date with webhook/config.py: run python -m tests.test_chart_schema --write"
    )


def _objects_without_closed_properties(node: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "<root>")
        for key, value in node.items():
            found += _objects_without_closed_properties(value, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _objects_without_closed_properties(value, f"{path}[{i}]")
    return found


def test_every_defined_object_is_closed():
    schema = json.loads(SCHEMA_PATH.read_text())
    # allOf/if/then fragments only narrow properties already defined and closed.
    open_ = [p for p in _objects_without_closed_properties(schema) if ".allOf[" not in p]
    assert open_ == []


@pytest.mark.parametrize("name", sorted(p.stem for p in VALUES.glob("*.yaml")))
def test_every_values_set_renders_settings_the_server_loads(tmp_path, name):
    """The rendered settings file loads with the server's own strict loader: a value the schema lets through and
    the server refuses would crash-loop every replica (all-on's ownerDefaults CronJob did)."""
    rendered = render_values(name)
    cm = next(o for o in rendered if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {}))
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    settings = settings_module.load_settings(path, environ={})
    assert "gpu-admission" in settings.exemptions.namespaces


# The pre-install and pre-upgrade hook that loads the rendered settings with the server's own loader: what the schema
# cannot catch fails `helm install` before any webhook configuration exists (found by a review).
CONFIG_CHECK = f"{FULLNAME}-config-check"


def run_config_check(
    objects: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    existing: dict[str, dict[str, str]] | None = None,
) -> tuple[int, str, str]:
    """The config-check Job's container, run here: the image's entrypoint (gpu-admission: webhook.cli) with the
    container's args and settings variables, and each volume it mounts written where it mounts it (a directory of
    its own under tmp_path/mounted, the paths in the files and args moved there): the hook's ConfigMap, or the
    user's Secret or ConfigMap of that name in ``existing`` ({key: text}), which the release does not make; an
    optional volume of an object not there is empty, as the kubelet leaves it. (exit code, stdout, stderr)."""
    spec = find(objects, "Job", CONFIG_CHECK)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert "command" not in container  # the image's ENTRYPOINT, gpu-admission (test_chart_dockerfile.py)
    volumes = {v["name"]: v.get("configMap") or v["secret"] for v in spec["volumes"]}
    made = {o["metadata"]["name"]: o["data"] for o in find_all(objects, "ConfigMap") if hooks(o)}
    places = {f"{m['mountPath']}/": f"{tmp_path}/mounted/{m['name']}/" for m in container["volumeMounts"]}

    def placed(text: str) -> str:
        for mount_path, directory in places.items():
            text = text.replace(mount_path, directory)
        return text

    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]]
        name = source.get("name") or source["secretName"]
        data = made.get(name, (existing or {}).get(name))
        assert data is not None or source.get("optional"), f"the pod never starts: {name} is not there"
        directory = Path(placed(f"{mount['mountPath']}/"))
        directory.mkdir(parents=True)
        paths = {i["key"]: i["path"] for i in source.get("items", [])} or {key: key for key in data or {}}
        for key, path in paths.items():
            if data and key in data:
                (directory / path).write_text(placed(data[key]))
    for name in [n for n in os.environ if n.startswith(settings_module.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for env in container["env"]:
        monkeypatch.setenv(env["name"], env["value"])
    capsys.readouterr()
    code = webhook_cli.main([placed(a) for a in container["args"]])
    out, err = capsys.readouterr()
    return code, out, err


def _server_refusal(objects: list[dict[str, Any]], tmp_path: Path) -> str:
    """What the server says at start of the settings the release's own ConfigMap gives it (its settings variables
    from extraEnv, as the Deployment sets them)."""
    path = tmp_path / "server.yaml"
    path.write_text(find(objects, "ConfigMap", FULLNAME)["data"]["config.yaml"])
    (container,) = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    environ = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    with pytest.raises(ConfigError) as refused:
        settings_module.load_settings(path, environ=environ)
    return str(refused.value)


def test_the_config_check_is_a_hook_before_everything_else_in_every_cert_mode():
    for name in VALUE_SETS:
        objects = render_values(name)
        job, config_map = find(objects, "Job", CONFIG_CHECK), find(objects, "ConfigMap", CONFIG_CHECK)
        assert config_map["data"] == find(objects, "ConfigMap", FULLNAME)["data"], name  # what the server reads
        weights = []
        for obj in (config_map, job):
            annotations = obj["metadata"]["annotations"]
            assert hooks(obj) == {"pre-install", "pre-upgrade"}, name
            assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded", name
            weights.append(int(annotations["helm.sh/hook-weight"]))
        others = [
            int(o["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
            for o in objects
            if hooks(o) & {"pre-install", "pre-upgrade"} and o not in (job, config_map)
        ]
        # the ConfigMap exists before the Job starts, and the Job has passed before any other hook (the certs Secret)
        assert weights[0] < weights[1] < min(others, default=0), name
        assert job["spec"]["podFailurePolicy"]["rules"] == [
            {"action": "FailJob", "onExitCodes": {"containerName": "check", "operator": "In", "values": [2]}}
        ]


def test_the_config_check_pod_takes_its_resources_and_the_certs_jobs_deadline():
    """A namespace quota that requires limits.cpu made no pod of resources that could not be set; a pool scaled from
    zero could outlast 120 s (found by a review). Its pod's mesh opt-out: test_chart.py, jobPodLabels."""
    objects = template("--set", "configCheck.resources.limits.cpu=200m")
    job = find(objects, "Job", CONFIG_CHECK)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    assert {j["spec"]["activeDeadlineSeconds"] for j in certs_jobs(objects)} == {job["spec"]["activeDeadlineSeconds"]}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_config_check_passes_the_value_sets(tmp_path, monkeypatch, capsys, name):
    code, out, err = run_config_check(render_values(name), tmp_path, monkeypatch, capsys)
    assert (code, err) == (0, ""), err
    assert out == f"{tmp_path}/mounted/config/config.yaml: settings the server loads\n"


@pytest.mark.parametrize("example", ["config.yaml", "config-cluster.yaml"])
def test_the_config_check_passes_the_example_settings(tmp_path, monkeypatch, capsys, example):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": yaml.safe_load((EXAMPLES / example).read_text())}))
    code, _, err = run_config_check(template("-f", str(values)), tmp_path, monkeypatch, capsys)
    assert (code, err) == (0, ""), err


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {"config": {"cuda": {"registry": {"enabled": True, "registries": ["https://nvcr.io"]}}}},
            "cuda.registry.registries: 'https://nvcr.io' is not a registry host as an image names it",
            id="registry-as-a-url",
        ),
        pytest.param(
            {"config": {"cluster": {"pools": [
                {"name": "a100", "nodeSelector": {"pool": "a100"}, "driverVersion": "R550"},
            ]}}},
            "cluster.pools: pool 'a100': driverVersion 'R550' is not a driver version",
            id="driver-branch-as-version",
        ),
        pytest.param(
            {"config": {"cluster": {"pools": [{
                "name": "a100", "nodeSelector": {"pool": "a100"}, "driverVersion": "550.54.15", "migStrategy": "single",
                "gpuProduct": "NVIDIA-A100-SXM4-40GB", "migProfiles": {"1g.5gb": 7, "3g.20gb": 2},
            }]}}},
            "cluster.pools: pool 'a100' has migStrategy single and 2 migProfiles",
            id="single-strategy-two-profiles",
        ),
        pytest.param(
            {"config": {"cluster": {"pools": [
                {"name": "a100", "nodeSelector": {"pool": "a100"}}, {"name": "a100", "nodeSelector": {"pool": "spot"}},
            ]}}},
            "cluster.pools: pool 'a100' is declared twice",
            id="pool-declared-twice",
        ),
        pytest.param(
            {"config": {"spot": {"extraLabels": {"node.example.com/capacity": "spot instance"}}}},
            "spot.extraLabels: node.example.com/capacity: 'spot instance' is not a node label",
            id="spot-label-with-a-space",
        ),
        pytest.param(
            {"config": {"cuda": {"driverTable": {"12.9": "r575"}}}},
            "cuda.driverTable: '12.9': 'r575' is not a CUDA version and the oldest driver for it",
            id="driver-table-branch",
        ),
        pytest.param(
            {"config": {"cluster": {"pools": [{"name": "h100", "nodeSelector": {"instance-type": "p5.48xlarge "}}]}}},
            "cluster.pools: pool 'h100': nodeSelector instance-type: 'p5.48xlarge ' is not a node label",
            id="selector-value-with-a-trailing-space",
        ),
        pytest.param(
            {"extraEnv": [{"name": "GPU_ADMISSION_CUDA__MODE", "value": "block"}]},
            "(set by the environment variable GPU_ADMISSION_CUDA__MODE)",
            id="settings-variable",
        ),
    ],
)  # fmt: skip
def test_the_config_check_refuses_what_the_server_refuses_at_start(tmp_path, monkeypatch, capsys, values, message):
    """Values the schema lets through and the server refuses at start: the hook Job exits 2 with the server's own
    message, which fails the install before the webhook configurations exist."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    for mode in ("selfSigned", "certManager"):
        objects = template("-f", str(path), "--set", f"certs.mode={mode}")
        refusal = _server_refusal(objects, tmp_path)
        assert message in refusal
        mounted = tmp_path / mode / "mounted" / "config" / "config.yaml"
        told = refusal.replace(str(tmp_path / "server.yaml"), str(mounted))
        assert run_config_check(objects, tmp_path / mode, monkeypatch, capsys) == (2, "", f"gpu-admission: {told}\n")


def _settings_leaves(cls: type = settings_module.Settings, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every setting of the server (its fields' snake_case names), a section's own fields within it."""
    hints = get_type_hints(cls)
    leaves: list[tuple[str, ...]] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        is_section = dataclasses.is_dataclass(tp) and isinstance(tp, type)
        leaves += _settings_leaves(tp, (*path, f.name)) if is_section else [(*path, f.name)]
    return leaves


def _other_than(schema: dict[str, Any], current: Any) -> Any:
    """A value the values schema takes for a setting (``schema``, its part of config_schema()) other than
    ``current``. A list's text item is a host with a port: the chart reads a registry's port."""
    kind = schema.get("type")
    if "enum" in schema:
        return next(option for option in reversed(schema["enum"]) if option != current)
    if kind == "array":
        item = schema["items"]
        return ["example.com:5000" if item == {"type": "string"} else _other_than(item, None)]
    if kind == "object" and "properties" in schema:  # a pool, a taint: its required fields
        return {key: _other_than(schema["properties"][key], None) for key in schema.get("required", [])}
    if kind == "object":
        return {"Example": _other_than(schema["additionalProperties"], None)}
    if kind == "boolean":
        return not current
    if kind in ("integer", "number"):
        return (current or 0) + 1
    return "example"


def _rendered_from(tmp_path: Path, config: dict[str, Any], *args: str, network_policy: bool = True) -> str:
    """What the chart renders from ``config`` but the settings themselves (the settings ConfigMaps' file and the
    checksum of it that rolls the pods), with the registry reader on and the NetworkPolicy as asked, so that each
    setting they read shows; or the render's refusal."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"networkPolicy": {"enabled": network_policy}, "config": config}))
    proc = helm("template", "r", str(CHART), "-n", "gpu-admission", "-f", str(path), *args, check=False)
    if proc.returncode:
        return proc.stderr
    objects = [o for o in yaml.safe_load_all(proc.stdout) if o]
    for obj in objects:
        obj.get("data", {}).pop("config.yaml", None)
        if obj["kind"] == "Deployment":
            del obj["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    return json.dumps(objects)


def _variable(path: tuple[str, ...]) -> str:
    return "GPU_ADMISSION_" + "__".join(part.upper() for part in path)


def _read_by_the_chart(tmp_path: Path, base: dict[str, Any], network_policy: bool) -> set[tuple[str, ...]]:
    """The settings whose change (to a value the values schema takes) changes the render, a refusal included."""
    defaults, schema = settings_module.Settings(), config_schema()
    unchanged = _rendered_from(tmp_path, base, network_policy=network_policy)
    read = set()
    for leaf in _settings_leaves():
        config = copy.deepcopy(base)
        *sections, name = [_camel(part) for part in leaf]
        section = functools.reduce(lambda node, key: node.setdefault(key, {}), sections, config)
        current = section.get(name, functools.reduce(getattr, leaf, defaults))
        part = functools.reduce(lambda node, key: node["properties"][key], [*sections, name], schema)
        section[name] = _other_than(part, current)
        rendered = _rendered_from(tmp_path, config, network_policy=network_policy)
        assert "the specifications of the schema" not in rendered, (leaf, rendered)  # the chart is asked
        if rendered != unchanged:
            read.add(leaf)
    return read


@pytest.mark.parametrize("network_policy", [True, False], ids=["network-policy", "no-network-policy"])
def test_extra_env_gives_the_server_every_setting_but_those_the_chart_renders_from(tmp_path, network_policy):
    """A setting given by a GPU_ADMISSION_ variable of extraEnv reaches the server and the config check, never the
    chart: GPU_ADMISSION_SPOT__DEFAULT=tolerate spot-tolerated the GPU pods alone, the matchConditions (widened by
    config.spot.default only) sending no CPU pod to the webhook (found by a review). Each setting whose change
    changes the render (a refusal included) is refused as a variable, and so is each section that holds one and each
    entry of a map below one; every other setting and section renders as a variable. The registry's settings the
    NetworkPolicy alone reads were refused without one, failing upgrades they changed nothing in (a review's)."""
    base: dict[str, Any] = {"cuda": {"registry": {"enabled": True}}}
    read = _read_by_the_chart(tmp_path, base, network_policy)
    below = {(*leaf, "team-a") for leaf in read}  # GPU_ADMISSION_SPOT__NAMESPACE_DEFAULTS__team-a: an entry of a map
    refused = set()
    for path in {leaf[:end] for leaf in _settings_leaves() for end in range(1, len(leaf) + 1)} | below:
        variable = ("--set", f"extraEnv[0].name={_variable(path)}", "--set", "extraEnv[0].value=x")
        if f"extraEnv: {_variable(path)} " in _rendered_from(tmp_path, base, *variable, network_policy=network_policy):
            refused.add(path)
    assert ("spot", "default") in read and ("cuda", "registry", "ca_file") in read
    assert (("cuda", "registry", "ecr") in read) == network_policy
    holding = {leaf[:end] for leaf in read for end in range(1, len(leaf) + 1)} | below
    assert refused == holding, (sorted(refused - holding), sorted(holding - refused))
    always, _, with_network_policy = _values_comment("extraEnv").partition("where networkPolicy.enabled")
    named = re.findall(r"\b[a-z]+(?:\.[A-Za-z]+)+\b", always + with_network_policy if network_policy else always)
    assert sorted(named) == sorted(".".join(map(_camel, leaf)) for leaf in read), "values.yaml's extraEnv comment"


def _refusal(tmp_path: Path, extra_env: list[dict[str, Any]], network_policy: bool = True) -> str:
    """The chart's refusal of ``extra_env``, past helm's own words (which name the template)."""
    variables = ("--set-json", f"extraEnv={json.dumps(extra_env)}")
    (line,) = [
        ln
        for ln in _rendered_from(tmp_path, {}, *variables, network_policy=network_policy).splitlines()
        if ln.startswith("Error:")
    ]
    return line.split("): ", 1)[1]


def test_a_settings_variable_the_chart_renders_from_is_refused_saying_what_to_set_instead(tmp_path):
    assert _refusal(tmp_path, [{"name": "GPU_ADMISSION_SPOT__DEFAULT", "value": "tolerate"}]) == (
        "extraEnv: GPU_ADMISSION_SPOT__DEFAULT sets config.spot.default, which the chart renders from (which pods are"
        " sent to the webhooks), and the chart cannot read a variable: the server alone would take it. Set"
        " config.spot.default in values instead. Drop GPU_ADMISSION_SPOT__DEFAULT: take it out of extraEnv in your"
        " values files, and to helm upgrade --reuse-values (which reuses the release's extraEnv) give extraEnv"
        " without it: --set-json 'extraEnv=[]'"
    )
    objects = template("--set", "config.spot.default=tolerate")  # what it says to do: every pod is sent
    sent = [
        condition["expression"]
        for configuration in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for webhook in find(objects, configuration)["webhooks"]
        for condition in webhook["matchConditions"]
        if condition["name"] == "gpu-related"
    ]
    assert sent and set(sent) == {"true"}


@pytest.mark.parametrize(
    ("name", "told", "not_told"),
    [
        pytest.param(
            "GPU_ADMISSION_CUDA__REGISTRY__CA_FILE", "Set registryCA.configMapName in values instead",
            "Set config.cuda.registry.caFile", id="ca-file",
        ),
        pytest.param(
            "GPU_ADMISSION_CUDA__REGISTRY__CREDENTIALS_FILE", "Set registryCredentials.secretName in values instead",
            "Set config.cuda.registry.credentialsFile", id="credentials-file",
        ),
        pytest.param(
            "GPU_ADMISSION_CUDA", "Give that section in values, under config.cuda, instead, or one variable for each"
            " of its fields the chart does not read (GPU_ADMISSION_CUDA__<FIELD>)",
            "Set config.cuda.registry", id="section",
        ),
    ],
)  # fmt: skip
def test_a_refused_variable_is_told_the_value_that_takes_its_place(tmp_path, name, told, not_told):
    """The registry reader's files were told to be set in config, which the chart refuses too (it sets them to what
    it mounts); a section's variable (GPU_ADMISSION_CUDA='{mode: warn}') was told to set the registry's settings it
    holds, not to give the section in config (a review's)."""
    refusal = _refusal(tmp_path, [{"name": name, "value": "x"}])
    assert told in refusal and not_told not in refusal, refusal


def test_a_refused_variable_is_dropped_from_a_reused_release_by_the_step_the_refusal_gives(tmp_path):
    """helm upgrade --reuse-values reuses the release's extraEnv whole: "take it out of extraEnv" left the user
    nothing to type (a review's). The refusal gives the list without every refused entry, which renders with the
    rest kept as they were."""
    kept: list[dict[str, Any]] = [
        {"name": "LOG_FORMAT", "value": "it's json"},
        {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
    ]
    refused = [{"name": "GPU_ADMISSION_SPOT__DEFAULT", "value": "a"}, {"name": "GPU_ADMISSION_CUDA", "value": "b"}]
    reused = [kept[0], refused[0], kept[1], refused[1]]
    refusal = _refusal(tmp_path, reused)
    assert all(re.search(rf"\b{entry['name']} (sets|gives) ", refusal) for entry in refused), refusal
    given = re.search(r"--set-json '.*'\Z", refusal)
    assert given, refusal
    step = shlex.split(given.group())
    path = tmp_path / "reused.yaml"
    path.write_text(yaml.safe_dump({"extraEnv": reused}))
    (container,) = find(template("-f", str(path), *step), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [e for e in container["env"] if e["name"] in ("LOG_FORMAT", "B")] == kept


@pytest.mark.parametrize(
    ("args", "at"),
    [
        pytest.param(("--set", "extraEnv[0].name=5"), "/extraEnv/0/name", id="numeric-name"),
        pytest.param(("--set", "extraEnv[0].value=5"), "/extraEnv/0/value", id="numeric-value"),
        pytest.param(("--set-json", 'extraEnv=[{"value": "a"}]'), "/extraEnv/0", id="no-name"),
        pytest.param(("--set-json", 'extraEnv=[{"name": "A", "valu": "a"}]'), "/extraEnv/0", id="misspelt-key"),
    ],
)
def test_an_extra_env_entry_that_is_no_env_var_is_refused_by_the_schema_where_it_is(args, at):
    """`--set extraEnv[0].name=5` failed in config-check.yaml with a bare Go template error ("wrong type for value;
    expected string; got int64", found by a review); a nameless entry or a number for a value rendered, to be refused
    by the API server. The schema refuses each, naming the entry."""
    proc = helm("template", "r", str(CHART), "-n", "gpu-admission", *args, check=False)
    assert proc.returncode and "the specifications of the schema" in proc.stderr and f"at '{at}'" in proc.stderr, (
        proc.stderr
    )


def test_an_extra_env_entry_of_an_empty_value_renders_an_empty_variable(tmp_path: Path) -> None:
    """`- name: NO_PROXY` with an empty `value:` rendered `value: null`, which Kubernetes takes as an empty
    variable; the schema that took an extraEnv entry as an EnvVar alone refused it, and with it a release that had
    one (`helm upgrade --reuse-values`; found by a review)."""
    path = tmp_path / "values.yaml"
    path.write_text("extraEnv:\n  - name: NO_PROXY\n    value:\n")
    (container,) = find(template("-f", str(path)), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"name": "NO_PROXY", "value": None} in container["env"], container["env"]


REGISTRY_FILES = (
    "--set", "config.cuda.registry.enabled=true", "--set", "registryCredentials.secretName=pulls",
    "--set", "registryCA.configMapName=harbor-ca", "--set", "registryCA.key=root.pem",
)  # fmt: skip
PULLS = json.dumps({"auths": {"nvcr.io": {"username": "$oauthtoken", "password": "key"}}})


def test_the_config_check_mounts_the_registry_files_the_server_mounts_optional():
    objects = template(*REGISTRY_FILES)
    check = find(objects, "Job", CONFIG_CHECK)["spec"]["template"]["spec"]
    server = find(objects, "Deployment")["spec"]["template"]["spec"]
    names = ("registry-credentials", "registry-ca")
    assert [m for m in check["containers"][0]["volumeMounts"] if m["name"] in names] == [
        m for m in server["containers"][0]["volumeMounts"] if m["name"] in names
    ]
    credentials = {"secretName": "pulls", "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}
    ca = {"name": "harbor-ca", "items": [{"key": "root.pem", "path": "ca.crt"}]}
    assert [v for v in server["volumes"] if v["name"] in names] == [
        {"name": "registry-credentials", "secret": credentials},
        {"name": "registry-ca", "configMap": ca},
    ]
    # the server's pods wait for the objects; the hook runs before an Argo CD sync or an umbrella chart makes them
    assert [v for v in check["volumes"] if v["name"] in names] == [
        {"name": "registry-credentials", "secret": {**credentials, "optional": True}},
        {"name": "registry-ca", "configMap": {**ca, "optional": True}},
    ]
    assert check["containers"][0]["args"][-1] == "--absent-registry-files"


@pytest.mark.parametrize(
    ("credentials", "ca", "words"),
    [
        pytest.param(PULLS, "ca", None, id="read"),
        pytest.param(None, None, None, id="not-made-yet"),
        pytest.param(
            '{"auths": {"nvcr.io": {}}}', "ca", "registry-credentials/config.json: auths['nvcr.io'] has neither auth",
            id="credentials-without-an-account",
        ),
        pytest.param(
            '{"credsStore": "desktop"}', None, "registry-credentials/config.json: no credentials in 'auths'",
            id="credentials-kept-elsewhere",
        ),
        pytest.param(PULLS, "not a certificate", "registry-ca/ca.crt: not a PEM file of CA certificates", id="ca"),
    ],
)  # fmt: skip
def test_the_config_check_reads_the_registry_files_as_the_server_does_at_start(
    tmp_path, monkeypatch, capsys, credentials, ca, words
):
    """A Secret or CA ConfigMap the server cannot use stopped it at start (exit 2), after the hook had passed (found
    by a review); one not made yet passes: the server's pods wait for it."""
    existing = {}
    if credentials is not None:
        existing["pulls"] = {".dockerconfigjson": credentials}
    if ca is not None:
        pem = issue_ca("registry CA", 1)[0].public_bytes(serialization.Encoding.PEM).decode()
        existing["harbor-ca"] = {"root.pem": pem if ca == "ca" else ca}
    code, out, err = run_config_check(template(*REGISTRY_FILES), tmp_path, monkeypatch, capsys, existing)
    path = tmp_path / "mounted" / "config" / "config.yaml"
    if words is None:
        assert (code, out, err) == (0, f"{path}: settings the server loads\n", "")
        return
    with pytest.raises(InputError) as refused:  # what `serve` runs first on the same files
        webhook_cli._settings(str(path))
    assert words in str(refused.value)
    assert (code, out, err) == (2, "", f"gpu-admission: {refused.value}\n")


def test_the_config_check_refuses_what_a_worker_refuses_when_it_boots(tmp_path, monkeypatch, capsys):
    """The settings loaded, each worker builds the cluster view from them when it boots: what that refuses (a
    provider unknown to the presets did, before the loader checked it) would kill every worker after the hook passed
    (found by a review)."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConfigError("cluster.providers: refused where the worker's cluster view is built")

    monkeypatch.setattr(cluster_module, "load_presets", refuse)  # what _Builder runs in build_view
    code, out, err = run_config_check(render_values("defaults"), tmp_path, monkeypatch, capsys)
    assert (code, out) == (2, "")
    assert err == "gpu-admission: cluster.providers: refused where the worker's cluster view is built\n"


def test_the_config_check_can_be_left_out():
    objects = template("--set", "configCheck.enabled=false")
    assert [o["metadata"]["name"] for o in objects if "config-check" in o["metadata"]["name"]] == []
    assert [j["metadata"]["name"] for j in find_all(objects, "Job")] == [
        f"{FULLNAME}-certs",
        f"{FULLNAME}-certs-pre",
        f"{FULLNAME}-certs-cleanup",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--set", "replicaCont=2"], "replicaCont", id="unknown-top-level-key"),
        pytest.param(["--set", "webhook.failurePolicy=Block"], "failurePolicy", id="bad-failure-policy"),
        pytest.param(["--set", "replicaCount=two"], "replicaCount", id="mistyped-replicas"),
        pytest.param(["--set", "webhook.timeoutSeconds.mutating=45"], "mutating", id="timeout-over-30"),
        pytest.param(["--set", "certs.mode=vault"], "mode", id="unknown-cert-mode"),
        pytest.param(["--set", "config.cuda.mode=block"], "mode", id="bad-settings-enum"),
        pytest.param(["--set", "config.cuda.unknownKey=1"], "unknownKey", id="unknown-settings-key"),
        pytest.param(["--set", "config.audit.eventQueueSize=many"], "eventQueueSize", id="mistyped-settings-value"),
        pytest.param(["--set", "certs.mode=provided"], "secretName", id="provided-without-secret"),
        pytest.param(["--set", "service.extra=1"], "extra", id="unknown-nested-key"),
        pytest.param(["--set", "config.maxBodyBytes=-1"], "maxBodyBytes", id="body-limit-refusing-all"),
        pytest.param(
            ["--set-json", 'config.cluster.pools=[{"name":"p","nodeSelector":{}}]'], "nodeSelector", id="empty-selector"
        ),
        pytest.param(["--set", "config.spot.gpuTaintPresets={sku-gpu}"], "gpuTaintPresets", id="unknown-preset"),
        # the presets' names, from providers.yaml: a typo killed every worker at boot (found by a review)
        pytest.param(
            ["--set", "config.cluster.providers={gke,coreweav}"],
            "at '/config/cluster/providers/1': value must be one of 'all', 'gke', 'eks', 'karpenter', 'aks', 'oke',"
            " 'coreweave', 'doks', 'vke', 'lke', 'scaleway', 'ovh', 'civo', 'nebius'",
            id="unknown-provider",
        ),
        # the server refuses it at start: its pods would crash-loop after the upgrade
        pytest.param(
            ["--set", "config.spot.ownerDefaults.DaemonSet=never"],
            "DaemonSet: never: a default never leaves a DaemonSet's pods alone",
            id="never-default-for-daemonsets",
        ),
        pytest.param(
            ["--set", "config.spot.ownerDefaults.DaemonSet=prefer"],
            "DaemonSet: prefer: a default prefer leaves a DaemonSet's pods alone",
            id="prefer-default-for-daemonsets",
        ),
        # the hook Job's CA (ten times as long) went past the year 9999 and crashed after install
        pytest.param(["--set", "certs.selfSigned.days=300000"], "/certs/selfSigned/days", id="days-past-9999"),
        # Bounds between two values, which JSON schema cannot state: `fail` in the templates.
        pytest.param(
            ["--set", "certs.selfSigned.days=30"],
            "certs.selfSigned.days (30) must be greater than certs.selfSigned.renewWithinDays (30)",
            id="certificate-renewed-on-every-run",
        ),
        pytest.param(
            ["--set", "preStopSleepSeconds=30"],
            "preStopSleepSeconds (30) must be less than terminationGracePeriodSeconds (30)",
            id="pre-stop-eats-the-grace-period",
        ),
        pytest.param(
            ["--set", "preStopSleepSeconds=10", "--set", "terminationGracePeriodSeconds=5"],
            "preStopSleepSeconds (10) must be less than terminationGracePeriodSeconds (5)",
            id="pre-stop-past-the-grace-period",
        ),
        pytest.param(["--set", "preStopSleepSeconds=-1"], "preStopSleepSeconds", id="negative-pre-stop"),
        pytest.param(
            ["--set", "podDisruptionBudget.minAvailable=2"],
            "podDisruptionBudget.minAvailable (2) must be less than replicaCount (2)",
            id="budget-blocks-every-drain",
        ),
        pytest.param(
            ["--set", "podDisruptionBudget.minAvailable=100%"],
            "podDisruptionBudget.minAvailable (100%) must be less than replicaCount",
            id="budget-of-every-replica",
        ),
        pytest.param(["--set", "podDisruptionBudget.minAvailable=half"], "minAvailable", id="budget-not-a-percentage"),
        pytest.param(
            ["--set", "podDisruptionBudget.minAvailable=75%"],
            "podDisruptionBudget.minAvailable (75%) must be less than replicaCount (2)",
            id="a-percentage-that-rounds-up-to-every-replica",
        ),
        pytest.param(
            ["--set", "podDisruptionBudget.minAvailable=150%"],
            "podDisruptionBudget.minAvailable (150%) must be less than replicaCount (2)",
            id="a-percentage-over-100",
        ),
        pytest.param(
            ["--set", "service.metricsPort=443"],
            "service.port and service.metricsPort are both 443: a Service cannot have two ports of one number",
            id="service-ports-of-one-number",
        ),
        pytest.param(
            ["--set", "config.spot.ownerDefaults.CronJob=prefer"],
            "config.spot.ownerDefaults: CronJob owns no pod (its Jobs own them)",
            id="owner-cronjob",
        ),
        pytest.param(
            ["--set", "config.spot.ownerDefaults.job=prefer"],
            'config.spot.ownerDefaults: "job" is not a kind as a pod\'s ownerReferences name it',
            id="owner-not-a-kind",
        ),
        pytest.param(
            ["--set", "config.spot.ownerDefaults.ReplicationController\\.core=prefer"],
            "config.spot.ownerDefaults: ReplicationController is of the core API group, which has no name",
            id="owner-of-the-core-group",
        ),
        pytest.param(
            ["--set", "registryCA.configMapName=ca", "--set", "registryCA.key=no spaces"],
            "at '/registryCA/key': 'no spaces' does not match pattern",
            id="registry-ca-key",
        ),
        pytest.param(
            ["--set", "serviceAccount.create=false"],
            "serviceAccount.name is required when serviceAccount.create is false",
            id="own-service-account-unnamed",
        ),
    ],
)
def test_schema_rejects(args, message):
    proc = helm("template", "r", str(CHART), "-n", "gpu-admission", *args, check=False)
    assert proc.returncode != 0, f"helm accepted {args}"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--set", "certs.selfSigned.days=31"], id="days-just-above-renewal"),
        pytest.param(["--set", "preStopSleepSeconds=29"], id="pre-stop-just-under-the-grace-period"),
        pytest.param(["--set", "podDisruptionBudget.minAvailable=50%"], id="budget-percentage"),
        pytest.param(["--set", "replicaCount=3", "--set", "podDisruptionBudget.minAvailable=2"], id="budget-of-two"),
        # a tolerate default reaches a DaemonSet's pods: the server loads it (found by a review)
        pytest.param(["--set", "config.spot.ownerDefaults.DaemonSet=tolerate"], id="tolerate-default-for-daemonsets"),
        # Another cert mode: the self-signed bounds do not apply.
        pytest.param(
            ["--set", "certs.mode=certManager", "--set", "certs.selfSigned.days=1"], id="self-signed-days-unused"
        ),
    ],
)
def test_schema_accepts_the_bounds(args):
    proc = helm("template", "r", str(CHART), "-n", "gpu-admission", *args, check=False)
    assert proc.returncode == 0, proc.stderr


def test_no_pre_stop_sleep_renders_no_hook():
    # A 0-second sleep action is refused before Kubernetes 1.32 (PodLifecycleSleepActionAllowZero): no hook at all.
    objects = template("--set", "preStopSleepSeconds=0")
    (container,) = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "lifecycle" not in container


# certs.selfSigned.renewSchedule as Kubernetes reads a CronJob's schedule when it is created: robfig/cron's
# ParseStandard (5 fields with names, ranges, steps, * and ?; or a macro, or @every <duration>), and no TZ=/CRON_TZ=
# (refused on create since the CronJob's timeZone field). Refused at render, not when the apiserver sees it.
SCHEDULE = "certs.selfSigned.renewSchedule"


def _with_schedule(tmp_path: Path, schedule: str, *args: str) -> subprocess.CompletedProcess[str]:
    # A values file: --set would split "JAN,jul" at the comma.
    values = tmp_path / "schedule.yaml"
    values.write_text(yaml.safe_dump({"certs": {"selfSigned": {"renewSchedule": schedule}}}))
    return helm("template", "r", str(CHART), "-n", "gpu-admission", "-f", str(values), *args, check=False)


@pytest.mark.parametrize(
    "schedule",
    [
        "23 3 * * *",
        "*/15 * * * *",
        "0 3 * * MON-FRI",
        "0 3 * * sun",
        "0 0 * * 0,6",
        "0 3 ? * *",
        "5/10 * * * *",
        "*/61 * * * *",  # a step past the range: accepted by Kubernetes (only minute 0)
        "07 03 * * *",
        "  23 3 * * *  ",
        "23\t3 * * *",
        "@hourly",
        "@daily",
        "@midnight",
        "@weekly",
        "0 3 */1 * *",
        "0 3 1-31 * *",
        "0 3 */2 * *",
        "0 3 1-31/2 * *",
        "@every 168h",
        "@every 90000ms",
        "@every 12h",
        "@every 1h30m",
    ],
)
def test_renew_schedule_accepts_what_kubernetes_accepts(tmp_path, schedule):
    proc = _with_schedule(tmp_path, schedule)
    assert proc.returncode == 0, proc.stderr
    (cron,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "CronJob"]
    assert cron["spec"]["schedule"] == schedule


@pytest.mark.parametrize(
    "schedule",
    ["@monthly", "@yearly", "@annually", "0 0 1 1 *", "59 23 31 12 6", "0 3 1-15/2 JAN,jul *", "0  0 31 * *",
     "@every 8760h", "@every 20000m", "@every 500.0h", "@every 1000000s", "@every 100h100h", "@every 169h",
     "0 3 */8 * *"],
)  # fmt: skip
def test_a_renew_schedule_rarer_than_weekly_is_refused(tmp_path, schedule):
    """Schedules Kubernetes takes, but between two of whose runs a certificate renewed 30 days before its end can
    expire: @yearly let it lapse for 204 days, the 31st of the month for a day (found by a review of the
    certificates' lifecycle, simulating years of runs)."""
    proc = _with_schedule(tmp_path, schedule)
    assert proc.returncode != 0
    assert "runs less often than once a week" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("schedule", "reason"),
    [
        pytest.param("23 3 * *", "it has 4 field(s), not the 5", id="four-fields"),
        pytest.param("0 23 3 * * *", "it has 6 field(s), not the 5", id="with-seconds"),
        pytest.param(" ", "it is blank", id="blank"),
        pytest.param("61 * * * *", "minute 61 is above 59", id="minute-61"),
        pytest.param("0 24 * * *", "hour 24 is above 23", id="hour-24"),
        pytest.param("0 0 0 * *", "day of month 0 is below 1", id="day-0"),
        pytest.param("0 0 * 13 *", "month 13 is above 12", id="month-13"),
        pytest.param("0 0 * * 7", "day of week 7 is above 6", id="sunday-as-7"),
        pytest.param(
            "0 0 * * MON-SUNDAY", 'day of week "SUNDAY" is neither a number nor a name (sun to sat)', id="long-name"
        ),
        pytest.param("0 0 L * *", 'day of month "L" is not a number', id="last-day"),
        pytest.param("*/0 * * * *", "minute step 0", id="step-0"),
        pytest.param("30-10 * * * *", "minute range 30-10 starts after it ends", id="backwards-range"),
        pytest.param("0,,3 * * * *", 'minute field "0,,3"', id="empty-list-item"),
        pytest.param("1-2-3 * * * *", 'minute field "1-2-3"', id="two-hyphens"),
        pytest.param("99999999999999999999 * * * *", "minute 99999999999999999999 is above 59", id="huge-number"),
        pytest.param("@reboot", '"@reboot" is not a macro', id="reboot"),
        pytest.param("@daily ", '"@daily " is not a macro', id="macro-with-a-space"),
        pytest.param("@every", '"@every" is not a macro', id="every-without-duration"),
        pytest.param("TZ=UTC 0 3 * * *", "Kubernetes refuses a time zone", id="tz"),
        pytest.param("CRON_TZ=Europe/Paris 0 3 * * *", "Kubernetes refuses a time zone", id="cron-tz"),
        pytest.param("daily", "it has 1 field(s), not the 5", id="word"),
        pytest.param(" @daily", "a macro must come first, with no space before it", id="space-before-macro"),
        pytest.param(
            "*/99999999999999999999 * * * *",
            "minute step 99999999999999999999: more digits than Kubernetes reads",
            id="huge-step",
        ),
    ],
)
def test_renew_schedule_refuses_what_kubernetes_refuses(tmp_path, schedule, reason):
    proc = _with_schedule(tmp_path, schedule)
    assert proc.returncode != 0, f"helm accepted {schedule!r}"
    assert f"{SCHEDULE} {json.dumps(schedule)} is not a schedule Kubernetes accepts: {reason}" in proc.stderr, (
        proc.stderr
    )
    assert '"" disables the renewal CronJob' in proc.stderr


def test_renew_schedule_unused_outside_self_signed_mode(tmp_path):
    # No CronJob is rendered then, so the schedule is not read (as certs.selfSigned.days).
    proc = _with_schedule(tmp_path, "61 * * * *", "--set", "certs.mode=certManager")
    assert proc.returncode == 0, proc.stderr


def _write() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    schema["properties"]["config"] = config_schema()
    SCHEMA_PATH.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        _write()
    else:
        print(__doc__)


def test_a_renew_schedule_of_under_a_minute_is_refused(tmp_path):
    """@every 1ms: Kubernetes runs such a CronJob every second, a certs Job a second against the API server."""
    proc = _with_schedule(tmp_path, "@every 1ms")
    assert proc.returncode != 0 and "more often than once a minute" in proc.stderr, proc.stderr
