"""Settings: one typed object from YAML and the environment, strict, with errors that name the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from webhook.config import Settings, load_settings
from webhook.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    assert load_settings(None, environ={}) == Settings()


def test_example_settings_load() -> None:
    settings = load_settings(EXAMPLES / "config.yaml", environ={})
    assert settings.spot.owner_defaults == {"Job": "tolerate"}
    assert {p.name for p in settings.cluster.pools} >= {"a100-spot"}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("cuda:\n  namespaceModes: {research: warn}\n", id="camelCase"),
        pytest.param("cuda:\n  namespace_modes: {research: warn}\n", id="snake_case"),
    ],
)
def test_keys_in_either_case(tmp_path: Path, text: str) -> None:
    assert load_settings(_write(tmp_path, text), environ={}).cuda.namespace_modes == {"research": "warn"}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("cuda:\n  mode: block\n", "cuda.mode: must be one of enforce, warn, off (got 'block')", id="enum"),
        pytest.param("cuda:\n  moed: warn\n", "cuda.moed: unknown setting", id="unknown-key"),
        pytest.param("audit:\n  eventQueueSize: lots\n", "audit.eventQueueSize: must be an integer", id="int"),
        pytest.param("audit:\n  events: 'yes'\n", "audit.events: must be true or false", id="bool"),
        pytest.param("cluster:\n  pools: [{driverVersion: '550'}]\n", "missing required setting name", id="required"),
        pytest.param(
            "cluster:\n  pools: [{name: new, driverVersion: '570.124.06'}]\n",
            "cluster.pools[0]: missing required setting nodeSelector",
            id="required-selector",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: new, nodeSelector: {}, driverVersion: '570.124.06'}]\n",
            "pool 'new' has no nodeSelector",
            id="empty-selector",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: g, nodeSelector: {a: b}, migStrategy: gke,"
            " migProfiles: {1g.5gb: 7, 3g.20gb: 2}}]\n",
            "pool 'g' has migStrategy gke and 2 migProfiles",
            id="gke-two-profiles",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: s, nodeSelector: {a: b}, migStrategy: single, migProfiles: {3g.20gb: 2}}]\n",
            "pool 's' has migStrategy single and no gpuProduct",
            id="single-without-product",
        ),
        pytest.param(  # nvidia-smi's name: the nodeSelector written from it was refused (found by a review)
            "cluster:\n  pools: [{name: s, nodeSelector: {a: b}, gpuProduct: 'NVIDIA A100-SXM4-80GB'}]\n",
            "pool 's': gpuProduct 'NVIDIA A100-SXM4-80GB' is not GFD's label value",
            id="product-with-a-space",
        ),
        pytest.param(  # a valid product of 55 characters made a MIG product label of 67 (found by a review)
            "cluster:\n  pools: [{name: s, nodeSelector: {a: b}, migStrategy: single, migProfiles: {2g.20gb: 2},"
            " gpuProduct: NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition}]\n",
            "makes the product label NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition-MIG-2g.20gb (67",
            id="single-product-too-long",
        ),
        pytest.param(  # the required affinity written from it was refused (found by a review)
            "spot:\n  extraLabels: {example.com/capacity: spot instance}\n",
            "spot.extraLabels: example.com/capacity: 'spot instance' is not a node label",
            id="extra-label-value",
        ),
        pytest.param(
            "spot:\n  extraLabels: {bad key: x}\n",
            "spot.extraLabels: bad key: 'x' is not a node label",
            id="extra-label-key",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: o, nodeSelector: {oci.oraclecloud.com/node-pool-id: ocid1.x}}]\n",
            "pool 'o': nodeSelector key oci.oraclecloud.com/node-pool-id is a node annotation",
            id="oke-pool-annotation",  # found by a review of provider journeys: steered pods matched no node
        ),
        pytest.param(
            "cluster:\n  pools: [{name: 'a100 or h100', nodeSelector: {a: b}, spot: true}]\n",
            "cluster.pools: pool name 'a100 or h100' is not a label value",
            id="pool-name",  # the spot-applied words name pools, and are read back (found by a review of this)
        ),
        pytest.param("maxBodyBytes: 0\n", "maxBodyBytes: 0 would refuse every AdmissionReview", id="body-limit"),
        pytest.param("cluster:\n  pools: {a: 1}\n", "cluster.pools: must be a list", id="list"),
        pytest.param("- just\n- a list\n", "must hold a mapping", id="not-a-mapping"),
        pytest.param("cuda: [unclosed\n", "not valid YAML", id="yaml"),
        pytest.param(
            "spot:\n  ownerDefaults: {Job: sometimes}\n", "spot.ownerDefaults.Job: must be one of", id="nested"
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {CronJob: tolerate}\n",
            "spot.ownerDefaults: CronJob owns no pod (its Jobs own them)",
            id="owner-that-owns-no-pod",
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {job: tolerate}\n",
            "spot.ownerDefaults: 'job' is not a kind as a pod's ownerReferences name it (CamelCase, from a capital"
            " letter: Job, ReplicaSet, Deployment, StatefulSet, ...), nor one with its API group"
            " (Job.batch.volcano.sh): did you mean 'Job'?",
            id="owner-kind-in-lower-case",
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {DaemonSet: never}\n",
            "spot.ownerDefaults: DaemonSet: never: a default never leaves a DaemonSet's pods alone",
            id="never-for-daemonsets-that-it-leaves-alone",
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {DaemonSet.apps: require}\n",
            "spot.ownerDefaults: DaemonSet.apps: require: a default require leaves a DaemonSet's pods alone",
            id="require-for-daemonsets-that-it-leaves-alone",
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {CronJob.batch: tolerate}\n",
            "spot.ownerDefaults: CronJob owns no pod (its Jobs own them)",
            id="owner-with-group-that-owns-no-pod",
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {Job.Batch.Volcano.sh: tolerate}\n",
            "spot.ownerDefaults: 'Job.Batch.Volcano.sh' is not a kind",
            id="owner-group-in-capitals",
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {Job.: tolerate}\n",
            "spot.ownerDefaults: 'Job.' is not a kind",
            id="owner-group-empty",
        ),
        pytest.param(
            "spot:\n  ownerDefaults: {ReplicationController.core: tolerate}\n",
            "spot.ownerDefaults: ReplicationController is of the core API group, which has no name",
            id="owner-of-the-core-group",
        ),
        pytest.param(
            'spot:\n  ownerDefaults: {"Job\\n": tolerate}\n',
            "spot.ownerDefaults: 'Job\\n' is not a kind",
            id="owner-with-a-line-end",
        ),
        pytest.param(
            "cuda:\n  mode: yes\n",
            "cuda.mode: must be one of enforce, warn, off (got true: YAML reads an unquoted yes, no, on or off as true"
            " or false; quote the value)",
            id="unquoted-yes",
        ),
        pytest.param(
            "spot:\n  gpuTaintPresets: [sku-gpu]\n",
            "spot.gpuTaintPresets: unknown preset 'sku-gpu' (known: aks-sku-gpu)",
            id="unknown-gpu-taint-preset",
        ),
        # met only by the cluster view each worker builds at boot, the typo killed every worker (found by a review)
        pytest.param(
            "cluster:\n  providers: [gke, coreweav]\n",
            "cluster.providers: unknown provider 'coreweav': give those whose presets the webhook has (all, gke, eks,"
            " karpenter, aks, oke, coreweave, doks, vke, lke, scaleway, ovh, civo, nebius)",
            id="unknown-provider",
        ),
        # a toleration of the empty key tolerates every taint of its effect
        pytest.param(
            "spot:\n  extraTaints: [{key: '', effect: NoSchedule}]\n",
            "spot.extraTaints[0]: taint key '' is not a taint key",
            id="empty-taint-key",
        ),
        # a block scalar's line end: "$" let it by, and every spot pod would fail to create
        pytest.param(
            'spot:\n  extraTaints: [{key: "example.com/spot\\n"}]\n',
            "spot.extraTaints[0]: taint key 'example.com/spot\\n' is not a taint key",
            id="taint-key-line-end",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {a: b}, taints: [{key: a, value: 'x y'}]}]\n",
            "cluster.pools[0].taints[0]: taint a: value 'x y' is not a label value",
            id="taint-value",
        ),
        # 13.10 read as 13.1 would replace the built-in row of CUDA 13.1
        pytest.param(
            'cuda:\n  driverTable: {13.10: "580.0"}\n',
            "cuda.driverTable: the key 13.1 is not a string: YAML read it as a number; quote it",
            id="unquoted-number-key",
        ),
        pytest.param(
            'cuda:\n  driverTable: {"13.4": garbage}\n',
            "cuda.driverTable: '13.4': 'garbage' is not a CUDA version",
            id="driver-table-row",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {a: b}, driverVersion: 550.90}]\n",
            "cluster.pools[0].driverVersion: must be a string (got 550.9: YAML read it as a number; quote it)",
            id="unquoted-driver",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {a: b}, driverVersion: r535}]\n",
            "pool 'p': driverVersion 'r535' is not a driver version",
            id="driver-version",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {a: b}}, {name: p, nodeSelector: {c: d}}]\n",
            "cluster.pools: pool 'p' is declared twice",
            id="duplicate-pool",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {'Bad Key!': x}}]\n",
            "pool 'p': nodeSelector Bad Key!: 'x' is not a node label",
            id="selector-key",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {pool: 'a b'}}]\n",
            "pool 'p': nodeSelector pool: 'a b' is not a node label",
            id="selector-value",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {a: b}, gpuCount: -3}]\n",
            "pool 'p': gpuCount -3 is below 0",
            id="negative-count",
        ),
        pytest.param(
            "cluster:\n  pools: [{name: p, nodeSelector: {a: b}, migStrategy: mixed, migProfiles: {bogus: 1}}]\n",
            "pool 'p': migProfiles bogus: 1: give a MIG profile",
            id="profile-name",
        ),
        pytest.param("cluster:\n  resyncSeconds: 0\n", "cluster.resyncSeconds: 0 is below 30", id="resync"),
        pytest.param("CUDA:\n  mode: warn\n", "CUDA: unknown setting", id="key-as-written"),
        pytest.param("maxBodyBytes: 10\n", "maxBodyBytes: 10 would refuse", id="top-level-as-written"),
        pytest.param("cuda:\n  mode: !!int abc\n", "not valid YAML", id="yaml-value-error"),
    ],
)
def test_bad_settings_name_the_key(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, text), environ={})
    assert words in str(err.value)


def test_unknown_key_error_lists_the_known_ones_as_written_in_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, "cuda:\n  moed: warn\n"), environ={})
    assert "namespaceModes" in str(err.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read settings file"):
        load_settings(tmp_path / "nope.yaml", environ={})


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "cuda:\n  mode: enforce\n  compatibility: minor\n")
    settings = load_settings(
        path, environ={"GPU_ADMISSION_CUDA__MODE": "warn", "GPU_ADMISSION_AUDIT__EVENTS": "false", "OTHER": "x"}
    )
    assert (settings.cuda.mode, settings.cuda.compatibility, settings.audit.events) == ("warn", "minor", False)


def test_bad_environment_value_is_named() -> None:
    with pytest.raises(ConfigError, match=r"cuda.mode: must be one of"):
        load_settings(None, environ={"GPU_ADMISSION_CUDA__MODE": "block"})
    with pytest.raises(ConfigError, match=r"GPU_ADMISSION_CUDA__MODE: not a YAML value \(mapping values"):
        load_settings(None, environ={"GPU_ADMISSION_CUDA__MODE": "a: b: c"})


def test_a_services_variables_are_not_settings() -> None:
    """Installed as the docs show, the Service is named gpu-admission, and the kubelet gives each pod of the
    namespace GPU_ADMISSION_SERVICE_HOST, GPU_ADMISSION_PORT_443_TCP_ADDR and the like: read as settings, they
    stopped the server at start ('service_host: unknown setting'; found by a review)."""
    links = {
        "GPU_ADMISSION_SERVICE_HOST": "10.96.0.10",
        "GPU_ADMISSION_SERVICE_PORT": "443",
        "GPU_ADMISSION_SERVICE_PORT_HTTPS": "443",
        "GPU_ADMISSION_PORT": "tcp://10.96.0.10:443",
        "GPU_ADMISSION_PORT_443_TCP": "tcp://10.96.0.10:443",
        "GPU_ADMISSION_PORT_443_TCP_PROTO": "TCP",
        "GPU_ADMISSION_PORT_443_TCP_PORT": "443",
        "GPU_ADMISSION_PORT_443_TCP_ADDR": "10.96.0.10",
        "GPU_ADMISSION_METRICS_SERVICE_HOST": "10.96.0.11",
    }
    settings = load_settings(None, environ={**links, "GPU_ADMISSION_CUDA__MODE": "warn"})
    assert settings == dataclasses.replace(Settings(), cuda=dataclasses.replace(Settings().cuda, mode="warn"))
    with pytest.raises(ConfigError, match=r"^max_body_bytes_x: unknown setting"):
        load_settings(None, environ={"GPU_ADMISSION_MAX_BODY_BYTES_X": "1"})  # what is no Service's still counts


def test_an_error_names_the_variable_that_set_the_value() -> None:
    """'cuda.mode: must be one of ...' sent the user looking for a value the settings file did not hold."""
    with pytest.raises(ConfigError, match=r"\(set by the environment variable GPU_ADMISSION_CUDA__UNKNOWN_VERSION\)$"):
        load_settings(None, environ={"GPU_ADMISSION_CUDA__UNKNOWN_VERSION": "maybe"})
    with pytest.raises(
        ConfigError, match=r"^cudaa: unknown setting .*\(set by the environment: GPU_ADMISSION_CUDAA__MODE\)$"
    ):
        load_settings(None, environ={"GPU_ADMISSION_CUDAA__MODE": "warn"})
    pools = "[{name: a, nodeSelector: {'bad key': x}}]"
    with pytest.raises(ConfigError, match=r"\(set by the environment variable GPU_ADMISSION_CLUSTER__POOLS\)$"):
        load_settings(None, environ={"GPU_ADMISSION_CLUSTER__POOLS": pools})


def test_an_error_in_the_file_names_the_file(tmp_path: Path) -> None:
    """A wrong file given as --config said "apiVersion: unknown setting" without naming it, where every other input
    error names its file (found by a review); a value a variable set names the variable, not the file."""
    path = _write(tmp_path, "cuda:\n  mode: block\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    assert str(err.value) == f"{path}: cuda.mode: must be one of enforce, warn, off (got 'block')"
    path = _write(tmp_path, "cuda:\n  mode: warn\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={"GPU_ADMISSION_CUDA__UNKNOWN_VERSION": "maybe"})
    assert str(err.value) == (
        "cuda.unknown_version: must be one of warn, deny, allow (got 'maybe') (set by the environment variable"
        " GPU_ADMISSION_CUDA__UNKNOWN_VERSION)"
    )


def test_the_environment_merges_into_keys_as_written(tmp_path: Path) -> None:
    path = _write(tmp_path, "maxBodyBytes: 4096\ncuda:\n  namespaceModes: {research: warn}\n")
    settings = load_settings(path, environ={"GPU_ADMISSION_MAX_BODY_BYTES": "8192", "GPU_ADMISSION_CUDA__MODE": "warn"})
    assert (settings.max_body_bytes, settings.cuda.mode, settings.cuda.namespace_modes) == (
        8192,
        "warn",
        {"research": "warn"},
    )


def test_a_settings_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"cuda:\n  mode: \xff\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: the settings file is not UTF-8 text"):
        load_settings(path, environ={})


@pytest.mark.parametrize("where", ["file", "environment"])
def test_an_unquoted_off_is_off(tmp_path: Path, where: str) -> None:
    """YAML 1.1 reads an unquoted off as false: where off is a value of the setting, false is read as it."""
    if where == "file":
        settings = load_settings(_write(tmp_path, "cuda:\n  mode: off\nspot:\n  ownerDefaults: {Job: off}\n"), {})
    else:
        settings = load_settings(
            None, environ={"GPU_ADMISSION_CUDA__MODE": "off", "GPU_ADMISSION_SPOT__DEFAULT": "off"}
        )
    assert settings.cuda.mode == "off"
    assert (settings.spot.owner_defaults.get("Job") if where == "file" else settings.spot.default) == "off"


def test_a_tolerate_default_for_daemonsets_is_accepted(tmp_path: Path) -> None:
    """Refused with prefer, require and never since an earlier commit, it crash-looped the webhook of a settings file
    that loaded before (found by a review): a tolerate default reaches a DaemonSet's pods."""
    text = "spot:\n  ownerDefaults: {DaemonSet: tolerate, DaemonSet.apps: off}\n"
    settings = load_settings(_write(tmp_path, text), {})
    assert settings.spot.owner_defaults == {"DaemonSet": "tolerate", "DaemonSet.apps": "off"}


def test_a_controllers_own_kind_is_accepted_as_an_owner(tmp_path: Path) -> None:
    settings = load_settings(
        _write(
            tmp_path, "spot:\n  ownerDefaults: {PyTorchJob: tolerate, RayCluster: prefer, Job.batch.volcano.sh: off}\n"
        ),
        {},
    )
    assert settings.spot.owner_defaults == {
        "PyTorchJob": "tolerate",
        "RayCluster": "prefer",
        "Job.batch.volcano.sh": "off",
    }


def test_a_declared_profile_variant_is_named_as_the_device_plugin_names_it(tmp_path: Path) -> None:
    """nvidia-smi writes 1g.5gb+me, the device plugin's resource is nvidia.com/mig-1g.5gb.me: a pool declared with
    the first offered a resource no pod asks for, and a single-strategy pod got a product label value with a '+'
    (found by a review of MIG)."""
    text = "cluster:\n  pools: [{name: p, nodeSelector: {a: b}, migStrategy: mixed, migProfiles: {1g.5gb+me: 7}}]\n"
    assert load_settings(_write(tmp_path, text), environ={}).cluster.pools[0].mig_profiles == {"1g.5gb.me": 7}
