"""gpu-admission serve | check-config | review | pools | image | certs | selftest."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import multiprocessing
import os
import shutil
import ssl
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from certs import cli as certs_cli
from webhook import PREFIX, cuda_version, pipeline, selftest
from webhook.admission import ReviewRequest, parse_review
from webhook.cluster import (
    ClusterSource,
    ClusterView,
    StaticCluster,
    build_view,
    format_pools,
    is_extended_resource_name,
    read_node_file,
)
from webhook.config import Settings, load_settings, yaml_type
from webhook.decisions import context_for
from webhook.documents import api_object, numbered, read_documents
from webhook.drivers import show_driver
from webhook.errors import BadRequest, ConfigError, InputError
from webhook.model import IGNORE_LABEL, TEMPLATE_PATHS, Context, as_dict, as_list, as_str, escaped
from webhook.policies.cuda import POLICY, driver_table
from webhook.quantity import QuantityError, parse_quantity
from webhook.registry import ImageConfigs, platform_order, read_credentials, trust

EXIT_ADMITTED, EXIT_DENIED, EXIT_UNUSABLE = 0, 1, 2
CUDA_ANNOTATION = PREFIX + POLICY


def load_nodes(path: str, settings: Settings) -> ClusterView:
    return build_view(read_node_file(path), settings, source=f"node list {path}")


def load_nodes_apart(path: str, settings: Settings) -> ClusterView:
    """``load_nodes`` in a short-lived child process: parsing 10,000 nodes grows a heap of hundreds of MB that
    Python keeps after the documents are gone; only the compact view comes back (pickled), so the server's master,
    and every worker forked from it, never holds that heap."""
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        view: ClusterView = pool.apply(load_nodes, (path, settings))
    return view


def cluster_source(settings: Settings, nodes: str | ClusterView | None) -> ClusterSource:
    """--nodes FILE (or the view already read from it), else in-cluster credentials, else KUBECONFIG, else the
    configured pools only."""
    if isinstance(nodes, ClusterView):
        return StaticCluster(nodes)
    if nodes:
        return StaticCluster(load_nodes(nodes, settings))
    from webhook.watch import live_cluster_from_environment

    live = live_cluster_from_environment(settings)
    if live is not None:
        return live
    return StaticCluster(build_view([], settings, source="settings"))


log = logging.getLogger("gpu_admission.cluster")

NO_NODES = (
    "cluster: no nodes known: no --nodes file, no in-cluster credentials, no kubeconfig (KUBECONFIG, "
    "~/.kube/config) and no cluster.pools in the configuration. The CUDA check cannot run (GPU pods are admitted "
    "'not checked (no eligible GPU node)') nor can MIG conversion (fractions are denied: no profile offered), "
    "though /readyz says ready. Give the webhook its nodes: run it in the cluster (its service account lists "
    "them), set KUBECONFIG, pass --nodes FILE (kubectl get nodes -o yaml), or declare cluster.pools"
)


def warn_without_nodes(settings: Settings, environ: dict[str, str] | None = None) -> None:
    """Found by a review: ``serve`` with no cluster source (``cluster_source``'s last resort, no pool declared) was
    ready with 0 nodes and admitted every GPU pod unchecked, and only the Events relay's log line hinted why. Said
    once, by the master, before the workers fork; readiness is left as it is (README: configured pools only)."""
    from webhook.watch import credentials_found

    if not settings.cluster.pools and not credentials_found(environ):
        log.warning(NO_NODES)


def _settings(path: str | None, absent_files: bool = False) -> Settings:
    settings = load_settings(path)
    _check_registry_files(settings, absent_files)
    return settings


def check_serving_pair(cert: str, key: str) -> None:
    """The TLS context built once here, before the workers fork: each worker builds its own at its first connection
    (``server.ReloadingTLS``), so a certificate that is not its key's (ca.crt given as --cert, a provided Secret's
    mismatched pair) started a server that said "serving on" and failed every handshake; under failurePolicy Fail,
    every GPU pod was refused (found by a review). A file that is not there is named (gunicorn's master had ended
    in a traceback). InputError."""
    from webhook.http1 import UnreadableTLS
    from webhook.server import server_context

    for path in (cert, key):
        if not Path(path).is_file():
            raise InputError(f"{path}: certificate or key file not found (make one: gpu-admission certs issue)")
    try:
        server_context(cert, key)
    except UnreadableTLS as err:  # an encrypted key: said as it is
        raise InputError(str(err)) from err
    except (OSError, ssl.SSLError) as err:
        raise InputError(
            f"--cert/--key ({cert}, {key}): {err}; give the serving certificate (tls.crt, not the CA's ca.crt) and"
            " the key it was issued for (tls.key)"
        ) from err


def cmd_serve(args: argparse.Namespace) -> int:
    from webhook.server import GunicornServer, ServeOptions, prepare_metrics_dir

    options = ServeOptions.from_args(args)
    prepare_metrics_dir()  # before the app (and prometheus_client) is imported
    from webhook.app import create_app
    from webhook.audit import build_recorder, start_event_relay

    settings = _settings(args.config)
    check_serving_pair(args.cert, args.key)
    # A node file is read once, here, before the fork: every worker inherits the view (and fails early, not each).
    nodes: ClusterView | None = load_nodes_apart(args.nodes, settings) if args.nodes else None
    if nodes is None:
        warn_without_nodes(settings)
    # --nodes (make run): no cluster, Events go to the log; else credentials decide (in-cluster, kubeconfig).
    relay = start_event_relay(settings, discover=not args.nodes)

    # The image configs the workers read from registries go through one directory, so that each is read once
    # (Docker Hub counts manifest reads against the address's pull limit, which the nodes share).
    shared = _images_directory() if settings.cuda.registry.enabled else None

    def factory() -> tuple[Any, ClusterSource]:
        cluster = cluster_source(settings, nodes)
        recorder = build_recorder(settings, cluster, relay_fd=relay.fd if relay else None)
        return create_app(settings, cluster=cluster, recorder=recorder, images_shared=shared), cluster

    cuda_version.load_data()  # in the master: no worker's first review reads the YAML
    # What the master holds now is shared with the workers page by page: keep the collector from touching it.
    gc.collect()
    gc.freeze()
    # The relay may take what is left of the graceful timeout (the workers mostly stop at once) to send what they
    # wrote: the kubelet's SIGKILL at the end of the grace period ends it anyway.

    def finish() -> None:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
        if relay:
            relay.finish(timeout=options.graceful_timeout)

    GunicornServer(options, factory, on_exit=finish).run()
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Load a settings file (and the environment's settings variables) as ``serve`` does, and stop there: exit 2 with
    the reason where ``serve`` would refuse to start. The chart's pre-install and pre-upgrade hook runs it on the
    settings the release renders, so a value the chart's schema lets through and the server refuses (a registry given
    as a URL, a pool declared twice) fails ``helm install`` before any webhook configuration exists, rather than
    leaving it (failurePolicy Fail) in front of pods that never start (found by a review). The registry reader's
    files (credentialsFile, caFile) are read as ``serve`` reads them (the hook mounts the Secret and ConfigMap the
    server mounts: a malformed one stopped the server at start, after the hook passed; found by a review);
    ``--absent-registry-files`` passes one that is not there. The settings are then folded into the cluster view
    each worker builds when it boots (with no node): what that refuses (a provider unknown to the presets did) kills
    every worker after the master has started (found by a review)."""
    build_view([], _settings(args.config, args.absent_registry_files), source="settings")
    print(f"{args.config}: settings the server loads")
    return 0


def _check_registry_files(settings: Settings, absent_files: bool = False) -> None:
    """The registry reader's files, refused at start where a worker would only log them (a Secret being renewed).
    ``absent_files``: a file that is not there passes (the chart's config check mounts the user's Secret and
    ConfigMap optional: one an Argo CD sync makes after its PreSync hooks is not there yet, and the server's pods,
    which mount them as required, wait for it)."""
    registry = settings.cuda.registry
    if not registry.enabled:
        return
    files = (registry.credentials_file, registry.ca_file)
    credentials, ca = [path if not absent_files or Path(path).exists() else "" for path in files]
    if path := credentials:
        try:
            read_credentials(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise InputError(f"cuda.registry.credentialsFile {path}: {err}") from err
    if path := ca:
        try:
            trust(path)
        except (OSError, ssl.SSLError) as err:
            raise InputError(f"cuda.registry.caFile {path}: not a PEM file of CA certificates ({err})") from err


def _images_directory() -> Path:
    """A new directory for the image configs the workers share; those an earlier server left (a container restarted
    keeps its /tmp: the chart's emptyDir) are taken out: their pid, in the name, runs no server now, or is ours."""
    own = os.getpid()
    for old in Path(tempfile.gettempdir()).glob("gpu-admission-images-*"):
        pid = old.name.split("-")[3] if old.name.count("-") >= 4 else ""
        if not pid.isdigit() or int(pid) == own or not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"gpu-admission-images-{own}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _object_kind(obj: Any) -> str:
    return str(obj.get("kind")) if isinstance(obj, dict) else type(obj).__name__


def _not_a_string(where: str, at: str, value: Any) -> InputError:
    return InputError(
        f"{where}: {at}: {json.dumps(value)} is not a string (YAML read it as a {yaml_type(value)}); quote it,"
        " as the API server takes only strings there"
    )


def _check_env(spec: dict[str, Any], at: str, where: str) -> None:
    """Each container's env names and values are strings: an unquoted ``value: 12.10`` (a float) is refused by the
    API server (cannot unmarshal number into EnvVar.value of type string), and the review read it as CUDA unknown
    and ADMITTED what the quoted "12.10" is DENIED for (found by a review)."""
    for list_name in ("initContainers", "containers", "ephemeralContainers"):
        for index, container in enumerate(map(as_dict, as_list(spec.get(list_name)))):
            for number, variable in enumerate(map(as_dict, as_list(container.get("env")))):
                for field in ("name", "value"):
                    value = variable.get(field)
                    if value is not None and not isinstance(value, str):
                        names = [f"container {container.get('name')}"]
                        if isinstance(name := variable.get("name"), str):
                            names.append(f"variable {name}")
                        named = f"{at}.{list_name}[{index}].env[{number}].{field} ({', '.join(names)})"
                        raise _not_a_string(where, named, value)


def _check_manifest(obj: dict[str, Any], where: str) -> None:
    """What the API server (or kubectl) would refuse, and the webhook would pass as "no pod spec": a reviewed kind
    without a pod spec at its place, a metadata or a label or annotation that is not a string, a container's env
    name or value that is not a string; InputError naming it."""
    kind = str(obj["kind"])
    node: Any = obj
    path: list[str] = []
    for key in (*TEMPLATE_PATHS[kind], "spec"):
        path.append(key)
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            found = "nothing" if node is None else f"a {type(node).__name__}"
            raise InputError(
                f"{where}: a {kind} needs a mapping at {'.'.join(path)} (its pod spec at"
                f" {'.'.join((*TEMPLATE_PATHS[kind], 'spec'))}); found {found} there"
            )
    template = TEMPLATE_PATHS[kind]
    for owner in sorted({(), template}):
        at = ".".join((*owner, "metadata"))
        metadata: Any = obj
        for key in (*owner, "metadata"):
            metadata = metadata.get(key) if isinstance(metadata, dict) else None
        if metadata is not None and not isinstance(metadata, dict):
            raise InputError(f"{where}: {at} is a {type(metadata).__name__}, not a mapping")
        for field in ("labels", "annotations"):
            values = as_dict(metadata).get(field)
            if values is not None and not isinstance(values, dict):
                raise InputError(f"{where}: {at}.{field} is a {type(values).__name__}, not a mapping")
            for key, value in as_dict(values).items():
                if not isinstance(value, str):
                    raise _not_a_string(where, f"{at}.{field}.{key}", value)
    _check_env(node, ".".join(path), where)


REVIEWED_KINDS = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
"""The kinds ``review`` takes (DESIGN, "Offline review"): those the chart's webhook rules send. Found by a review:
a ReplicationController was reviewed, which no installed webhook is ever sent."""


def _admission_request(review: dict[str, Any], where: str) -> ReviewRequest:
    """An AdmissionReview's request, read as the server reads it (``admission.parse_review``). Found by a review:
    ``review -f examples/admission-review.json`` said "kind 'AdmissionReview' is not reviewed"."""
    body = json.dumps(review).encode()
    try:
        request = parse_review(body, len(body))
    except BadRequest as err:
        raise InputError(f"{where}: {err}") from None
    if request.operation not in ("CREATE", "UPDATE"):
        raise InputError(
            f"{where}: request.operation is {request.operation}; the webhook reviews a CREATE or an UPDATE"
        )
    return request


def _controller(obj: dict[str, Any]) -> dict[str, Any]:
    """The ownerReference of ``obj`` that says ``controller: true`` ({} where none does)."""
    owners = as_list(as_dict(obj.get("metadata")).get("ownerReferences"))
    return next((o for o in owners if isinstance(o, dict) and o.get("controller") is True), {})


def _made_by(obj: dict[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    """The user and groups a Pod of a built-in controller (a ReplicaSet's, a Job's, ...: its ownerReference with
    ``controller: true``) is created by in a cluster (``pipeline.pod_creator``); None for another object. Found by a
    review: such a Pod was reviewed as created by whoever runs review, and a controller's exemption did not apply."""
    if obj.get("kind") != "Pod" or not (owner := _controller(obj)):
        return None
    group = as_str(owner.get("apiVersion")).rpartition("/")[0]
    creator = pipeline.pod_creator(as_str(owner.get("kind")), group)
    return (creator, pipeline.SERVICE_ACCOUNT_GROUPS) if creator else None


def _review(obj: dict[str, Any], ctx: Context) -> pipeline.Result:
    """``pipeline.review``; on a pod UPDATE, ``pipeline.validate`` too whatever the mutating step said, as the
    apiserver calls every webhook whose rules match the request, the validating ones after the mutating ones. A pod
    update's mutating step only guards the webhook's annotations (``pipeline.protect_outputs``) and skips one that
    leaves them as they were, such as the update that takes the pod's last scheduling gate away, which /validate
    reviews. Found by a review: a Kueue ungate that /validate refuses was ADMITTED."""
    result = pipeline.review(obj, ctx)
    if ctx.operation != "UPDATE" or obj.get("kind") != "Pod" or not result.allowed or not result.skipped:
        return result
    checked = pipeline.validate(result.object, ctx)
    return result if checked.skipped else checked


class _NotReviewed(InputError):
    """An object of a kind the webhook is not sent (a Service, a ConfigMap): passed over in a stream of several."""

    def __init__(self, where: str, kind: str) -> None:
        kinds = ", ".join(REVIEWED_KINDS)
        super().__init__(
            f"{where}: kind {kind!r} is not reviewed (expected one of {kinds}, or an AdmissionReview of one)"
        )
        self.where, self.kind = where, kind


@dataclasses.dataclass
class _Item:
    """One object to review: where it stands in the input, the object, the AdmissionReview request it came in (None
    for a manifest), and the namespace it is reviewed in."""

    at: str
    obj: dict[str, Any]
    request: ReviewRequest | None
    namespace: str

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return _name(self.obj)


def _name(obj: dict[str, Any]) -> str:
    """An object's name, or the prefix its name is generated from ('' when it has neither)."""
    metadata = as_dict(obj.get("metadata"))
    return str(metadata.get("name") or metadata.get("generateName") or "")


def _objects(docs: list[Any], path: str) -> list[tuple[str, Any]]:
    """Each object of the input with where it stands: its document (``documents.numbered``) and, in a ``kind:
    List`` (what ``kubectl get -o yaml`` prints), its place in the items."""
    found: list[tuple[str, Any]] = []
    for at, doc in numbered(docs, path):
        _flatten(at, doc, 0, found)
    return found


MAX_LIST_DEPTH = 16
"""How deep Lists inside Lists are opened; deeper is unusable input (no tool writes that)."""


def _flatten(at: str, value: Any, depth: int, found: list[tuple[str, Any]]) -> None:
    """``value``, or the items of a List at every depth (``items[0].items[2]``), into ``found``, as kubectl opens
    them (cli-runtime's FlattenListVisitor). Found by a review: a List inside a List was passed over, exit 0."""
    items = value.get("items") if isinstance(value, dict) and str(value.get("kind")).endswith("List") else None
    if not isinstance(items, list):
        found.append((at, value))
        return
    if depth == MAX_LIST_DEPTH:
        raise InputError(f"{at}: Lists nested more than {MAX_LIST_DEPTH} deep; give the objects in fewer Lists")
    for index, item in enumerate(items):
        _flatten(f"{at}{'.' if depth else ', '}items[{index}]", item, depth + 1, found)


def _label(value: Any) -> str:
    """`` (Kind namespace/name)`` of an object, as far as it says them ('' when it is not a mapping); of an
    AdmissionReview, its request's object's, said to be in one (found by a review: "(AdmissionReview (no name))")."""
    if not isinstance(value, dict):
        return ""
    request, came = {}, ""
    if value.get("kind") == "AdmissionReview":
        request = as_dict(value.get("request"))
        value, came = request.get("object") or request.get("oldObject"), " in an AdmissionReview"
        if not isinstance(value, dict):
            return " (AdmissionReview of no object)"
    # the request's namespace first, as ``_item`` reviews it (the API server's)
    namespace = request.get("namespace") or as_dict(value.get("metadata")).get("namespace")
    return f" ({_shown(_object_kind(value), namespace, _name(value))}{came})"


def _shown(kind: str, namespace: Any, name: str) -> str:
    """``Kind namespace/name`` as review prints an object, in its headers and on stderr: escaped, so that a name
    cannot start a line of its own, such as a forged header (found by a review: a generateName with a newline)."""
    return escaped(f"{kind} {f'{namespace}/' if namespace else ''}{name or '(no name)'}")


def _item(at: str, value: Any, namespace: str | None, labelled: bool) -> _Item:
    """The object at ``at``, checked as the API server would check it; _NotReviewed for a kind the webhook is not
    sent, InputError for one it cannot review. ``labelled``: messages name its kind and name (one of several)."""
    where = at + _label(value) if labelled else at
    if not isinstance(value, dict):
        found = "a list" if isinstance(value, list) else f"the {type(value).__name__} {str(value)[:40]!r}"
        raise InputError(f"{where}: expected an object (a Pod or a workload), found {found}")
    obj = api_object(value, where)
    request = None
    if obj.get("kind") == "AdmissionReview":  # its request's object, in its request's namespace and operation
        request = _admission_request(obj, where)
        obj, where = request.object, f"{where}: request.object"
    if obj.get("kind") not in REVIEWED_KINDS:
        raise _NotReviewed(where, _object_kind(obj))
    _check_manifest(obj, where)
    namespace = (
        namespace
        or (request.namespace if request else "")
        or str(as_dict(obj.get("metadata")).get("namespace") or "default")
    )
    if pipeline.pod_view(obj, namespace, writable=False) is None:  # a Pod without metadata
        raise InputError(f"{where}: a {obj['kind']} needs its metadata (a mapping with its name)")
    return _Item(at, obj, request, namespace)


def _items(path: str, namespace: str | None) -> tuple[list[_Item], int, int]:
    """The objects of the input to review, how many could not be (each said on stderr) and how many it holds. One
    of a kind the webhook is not sent is said and passed over. One object alone: what is wrong with it is the
    command's error, as it always was."""
    found = _objects(read_documents(path), path)
    if not found:
        raise InputError(f"{path}: no object in it (empty, or a List without items); give a Pod or a workload manifest")
    if len(found) == 1:
        return [_item(*found[0], namespace, labelled=False)], 0, 1
    items: list[_Item] = []
    unusable = 0
    for at, value in found:
        try:
            items.append(_item(at, value, namespace, labelled=True))
        except _NotReviewed as err:
            print(
                f"gpu-admission: {err.where}: not reviewed: kind {err.kind!r} is not a Pod or a workload",
                file=sys.stderr,
            )
        except InputError as err:
            unusable += 1
            print(f"gpu-admission: {err}", file=sys.stderr)
    if unusable:
        print(f"gpu-admission: {path}: {unusable} of its {len(found)} objects could not be reviewed", file=sys.stderr)
    elif not items:
        raise InputError(
            f"{path}: nothing to review: none of its {len(found)} objects is a Pod or a workload"
            f" ({', '.join(REVIEWED_KINDS)}), or an AdmissionReview of one"
        )
    return items, unusable, len(found)


@dataclasses.dataclass
class _Pods:
    """What becomes of a workload's pods, each as its controller creates it."""

    passed: str = ""
    """Why each is passed untouched ('' where they are reviewed)."""
    refused: list[str] = dataclasses.field(default_factory=list)
    """Why each would be refused (none where they are admitted, or passed)."""
    warnings: list[str] | None = None
    """What the second review of a workload the webhook passes over warns of its pods (the MIG profile or the
    fallback they get); None where there was none (the webhook's own warnings then say it)."""

    @property
    def allowed(self) -> bool:
        return not self.refused


def _left(item: _Item, result: pipeline.Result, ctx: Context, refusals: list[str]) -> pipeline.Untouched:
    """What the Pod, or each pod of the workload, is left with unconverted though admitted: it stays Pending, or
    gets no GPU (``pipeline.unconverted``); nothing where the object is refused (no pod is made). Found by reviews:
    such a Pod, or with MIG conversion off a workload, said ADMITTED and exited 0."""
    view = pipeline.pod_view(item.obj, item.namespace, writable=False)
    if view is None or not result.allowed or refusals:
        return pipeline.Untouched([], [])
    return pipeline.unconverted(view, ctx, result.skipped)


def _pods(item: _Item, result: pipeline.Result, ctx: Context) -> _Pods | None:
    """What becomes of a workload's pods (None for a Pod). Where the webhook passes a workload over for a reason of
    its own (its creator exempt, its own opt-out label, a Deployment's ReplicaSet, an update that leaves its template
    as stored), its pods are still reviewed, each as its controller creates it: its template is reviewed as the same
    workload's made anew, of no owner and no opt-out label of its own, in its namespace, by no exempt user. Found by
    a review: such a workload said ADMITTED, and podsAllowed true, of pods the webhook would each refuse."""
    view = pipeline.pod_view(item.obj, item.namespace, writable=False) if item.kind != "Pod" else None
    if view is None:
        return None
    if passed := pipeline.pods_pass(view, ctx):  # the webhook's own review says so where it is not passed over
        return _Pods(passed=passed)
    if not result.skipped:
        return _Pods(refused=result.pods_refused)
    metadata = {k: v for k, v in as_dict(item.obj.get("metadata")).items() if k != "ownerReferences"}
    metadata["labels"] = {k: v for k, v in as_dict(metadata.get("labels")).items() if k != IGNORE_LABEL}
    made = Context(
        settings=ctx.settings, cluster=ctx.cluster, namespace=item.namespace, images=ctx.images, limited=False
    )
    anew = _review({**item.obj, "metadata": metadata}, made)
    if anew.skipped:
        return _Pods(passed=anew.skipped)
    refused = [*([] if anew.allowed else anew.message.split("\n")), *anew.pods_refused]
    return _Pods(refused=refused, warnings=[w for w in anew.warnings if w not in refused])


def _api_refusals(item: _Item, result: pipeline.Result, ctx: Context) -> list[str]:
    """Why the API server refuses the object the webhook lets through as it stands ([] where it takes it): an
    extended resource that is not a whole number (reference/mig.md §3, validated at the object's create; a
    workload's pod template with it). Found by a review: a workload the webhook passes over (its creator exempt)
    kept nvidia.com/gpu 0.5, which review converted as if the webhook had, and said ADMITTED."""
    view = pipeline.pod_view(result.object, item.namespace, writable=False) if result.allowed else None
    if view is None:
        return []
    if result.skipped == pipeline.DEPLOYMENTS_REPLICASET and not ctx.settings.mig.enabled:  # nothing is converted
        who = f"the webhook passes over a Deployment's ReplicaSet, and {pipeline.MIG_OFF}"
    elif result.skipped == pipeline.DEPLOYMENTS_REPLICASET:
        # review sees the ReplicaSet alone: a Deployment asking this is converted by the webhook (its ReplicaSets
        # then carry the device) or refused, by the webhook (a request without its limit) or by the API server (the
        # Deployment passed over, its creator exempt or its own opt-out label); either way no Deployment the cluster
        # took writes this template (found by reviews: each of two wordings was false in one of the cases)
        who = "the webhook passes over a Deployment's ReplicaSet, whose template the Deployment controller copies from"
        who += " the Deployment as stored: a Deployment asking this is converted by the webhook or refused (by the"
        who += " webhook, or by the API server where the webhook passes it over), so no Deployment the cluster took"
        who += " writes it; change it in the Deployment's manifest"
    elif result.skipped:
        who = f"the webhook passes it over, {result.skipped}"
    else:
        who = "the webhook admits it unconverted"
    advice = "ask for a whole number of GPUs or a MIG device (nvidia.com/mig-<profile>: 1)"
    if ctx.settings.mig.enabled and item.kind != "Pod" and not pipeline.pods_pass(view, ctx):
        advice += ", or a GPU memory size (gpu-admission.io/gpu-memory: 20Gi), which the webhook converts on each pod"
    refusals: list[str] = []
    for _, container in view.containers():
        resources = as_dict(container.get("resources"))
        requests, limits = as_dict(resources.get("requests")), as_dict(resources.get("limits"))
        said: set[str] = set()
        for name, value in [*limits.items(), *requests.items()]:  # each on its own: a whole limit hid a 0.5 request
            try:
                whole = not is_extended_resource_name(name) or parse_quantity(value) % 1 == 0
            except QuantityError:
                continue  # not a quantity: the API server's own message says so
            if not whole and name not in said:
                said.add(name)
                what = advice if name.startswith("nvidia.com/") or name in GPU_ASKS else "ask for a whole number of it"
                refusals.append(
                    f"container {container.get('name')}: {name} {value}: the API server refuses the {item.kind}, as"
                    f" an extended resource must be a whole number ({who}); {what}"
                )
        for name, value in requests.items():  # a request needs its limit, equal to it (ValidateResourceRequirements)
            if name in said or not (is_extended_resource_name(name) or name.startswith("hugepages-")):
                continue  # IsOvercommitAllowed: true for the native resources but hugepages
            try:
                differs = name not in limits or parse_quantity(value) != parse_quantity(limits[name])
            except QuantityError:
                continue
            if differs:
                said.add(name)
                limit = f"its limit {limits[name]}" if name in limits else "no limit"
                refusals.append(
                    f"container {container.get('name')}: {name} requests {value} with {limit}: the API server refuses"
                    f" the {item.kind}, as a request of a resource that cannot be overcommitted (an extended resource,"
                    f" hugepages) must equal its limit ({who}); give it in limits (the request is then set to it)"
                )
    return refusals


GPU_ASKS = frozenset({"gpu-admission.io/gpu-memory"})
"""With NVIDIA's own (nvidia.com/), the resources a GPU advice is about; another extended resource's fraction is told
to ask a whole number of it."""


def _verdict(
    item: _Item, result: pipeline.Result, pods: _Pods | None, refusals: list[str], left: pipeline.Untouched
) -> dict[str, Any]:
    """The contract's object (DESIGN, "Offline review"); a workload's says too whether its pods would be admitted
    as they are created (``podsAllowed``; passed untouched counts as admitted) and why not (``podsRefused``): the
    webhook admits a template whose pods it would each refuse, and passes over some workloads whose pods it
    reviews; ``podsPending`` and ``podsWithoutGpu``: why its pods would stay Pending or run with no GPU, though
    admitted (a Pod's own, where there are such lines). Where the API server refuses the object the webhook lets
    through, ``apiServerRefuses`` says why (and there are no pods to judge)."""
    verdict = {
        "allowed": result.allowed,
        "message": result.message,
        "warnings": result.warnings,
        "patch": result.patch,
        "object": result.object,
    }
    if pods is not None:
        verdict["podsAllowed"] = result.allowed and pods.allowed
        verdict["podsRefused"] = pods.refused
        if pods.warnings is not None:
            verdict["podsWarnings"] = pods.warnings
    if pods is not None or left.pending:
        verdict["podsPending"] = left.pending
    if pods is not None or left.no_gpu:
        verdict["podsWithoutGpu"] = left.no_gpu
    if refusals:
        verdict["apiServerRefuses"] = refusals
    return verdict


def _print_text(
    item: _Item,
    result: pipeline.Result,
    pods: _Pods | None,
    refusals: list[str],
    left: pipeline.Untouched,
    creator: str = "",
) -> None:
    """``creator``: the user a Pod is reviewed as created by, its controller's (``_made_by``), said under its
    verdict."""
    listed: list[str] = []  # the warnings said as why its pods are refused, not said again
    if refusals:
        print("DENIED by the API server")
        for why in refusals:
            print(f"- {escaped(why)}")
    elif result.allowed and pods is not None and not pods.allowed:
        print("PODS DENIED")
        itself = (
            f"passes the {item.kind} itself over ({result.skipped})"
            if result.skipped
            else f"admits the {item.kind} itself"
        )
        print(f"the webhook {itself}, but would refuse each pod it makes, as the pod is created:")
        for why in pods.refused:
            print(f"- {escaped(why)}")
        listed = pods.refused
    elif left.pending or left.no_gpu:  # a Pod's verdict is its workload's, of one pod: PENDING, PODS PENDING
        if pods is not None:
            print("PODS PENDING" if left.pending else "PODS GET NO GPU")
        else:
            print("PENDING" if left.pending else "GETS NO GPU")
        whose, itself = ("its pods'", f"the {item.kind} itself") if pods is not None else ("its", f"the {item.kind}")
        said = f"passes {itself} over ({result.skipped})" if result.skipped else f"admits {itself}"
        print(f"the webhook {said}, but {whose} GPU ask is never converted:")
        listed = [*left.pending, *left.no_gpu]
        for why in listed:
            print(f"- {escaped(why)}")
    else:
        print(("ADMITTED" if result.allowed else "DENIED") + (f" ({result.skipped})" if result.skipped else ""))
        if result.skipped and pods is not None:
            print(
                f"its pods are passed untouched too, as they are created ({pods.passed})"
                if pods.passed
                else "its pods are reviewed each as it is created, and would be admitted"
            )
    if creator:
        owner = _controller(item.obj)
        print(
            f"reviewed as created by {creator}, as its controller {escaped(as_str(owner.get('kind')))}"
            f" {escaped(as_str(owner.get('name')) or '(no name)')} creates it in a cluster"
        )
    if pods is not None and pods.warnings:  # under the pods line: the second review's, of its pods
        for w in pods.warnings:
            if w not in listed:
                print(f"Warning (its pods): {escaped(w)}")
    if result.message:  # a denial a line, each with a user's values (a container's name): \r, \x1c are escaped too
        print("\n".join(escaped(line) for line in result.message.split("\n")))
    for w in result.warnings:
        if w not in listed:
            print(f"Warning: {escaped(w)}")  # a user's value may bring a newline in
    template = pipeline.pod_view(result.object, item.namespace, writable=False) if result.allowed else None
    annotations = template.annotations if template is not None else {}  # a workload's: its pod template's
    for key, value in sorted(annotations.items()):
        if key.startswith("gpu-admission.io/"):
            # the cuda annotation's lines are the webhook's own (a user's newline in one is escaped there): a line each
            lines = str(value).split("\n") if key == CUDA_ANNOTATION else [str(value)]
            print(f"{escaped(key)}: " + "\n  ".join(escaped(line) for line in lines))
    if result.patch:
        print("patch:")
        print(json.dumps(result.patch, indent=2))


def cmd_review(args: argparse.Namespace) -> int:
    """Review each Pod and workload of the input (one object, or a stream of documents and Lists: ``helm
    template``, ``kustomize build``); exit 2 where one could not be reviewed, else 1 where one is denied or is a
    workload whose pods would each be, or would stay Pending or run with no GPU, else 0."""
    if args.file == "-" and args.nodes == "-":  # the second read found it empty, and was told to write a file "-"
        raise InputError(
            "-f - and --nodes -: standard input can be read once; give the manifest or the nodes as a file"
        )
    settings = _settings(args.config)
    items, unusable, held = _items(args.file, args.namespace)
    if not items:
        return EXIT_UNUSABLE
    view = load_nodes(args.nodes, settings)
    # cuda.registry on: an image's config is read here and now (the server reads in the background)
    images = None
    if settings.cuda.registry.enabled:
        order = platform_order(cuda_version.gpu_arches(view))
        images = ImageConfigs(settings.cuda.registry, background=False, platforms=lambda: order)
    verdicts: list[dict[str, Any]] = []
    denied = False
    for item in items:
        made_by: tuple[str, tuple[str, ...]] = ("", ())  # an AdmissionReview's user is its request's
        if item.request:  # as the server makes it: the request's operation, oldObject, user and groups, dryRun
            made = context_for(item.request, settings, view, images)
            ctx = dataclasses.replace(made, namespace=item.namespace, limited=False)
        else:
            user, groups = made_by = _made_by(item.obj) or ("", ())
            ctx = Context(
                settings=settings,
                cluster=view,
                namespace=item.namespace,
                username=user,
                groups=groups,
                images=images,
                limited=False,
            )
        result = _review(item.obj, ctx)
        refusals = _api_refusals(item, result, ctx)
        pods = None if refusals else _pods(item, result, ctx)
        left = _left(item, result, ctx, refusals)
        broken = bool(left.pending or left.no_gpu)  # admitted, of no use: Pending for good, or with no GPU
        denied = denied or not result.allowed or bool(refusals) or (pods is not None and not pods.allowed) or broken
        if args.output == "json":
            named = {"kind": item.kind, "name": item.name, "namespace": item.namespace} if held > 1 else {}
            created = {"createdBy": made_by[0]} if made_by[0] else {}
            verdicts.append({**named, **_verdict(item, result, pods, refusals, left), **created})
            continue
        if held > 1:
            came = ", in an AdmissionReview" if item.request else ""
            print(f"== {_shown(item.kind, item.namespace, item.name)} ({item.at}{came})")
        _print_text(item, result, pods, refusals, left, made_by[0])
    if args.output == "json":
        print(json.dumps(verdicts if held > 1 else verdicts[0], indent=2))
    if unusable:
        return EXIT_UNUSABLE
    return EXIT_DENIED if denied else EXIT_ADMITTED


def cmd_pools(args: argparse.Namespace) -> int:
    settings = _settings(args.config)
    view = load_nodes(args.nodes, settings)
    if args.output == "json":
        print(json.dumps([p.as_json() for p in view.pools], indent=2))
    else:
        print(format_pools(view))
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    """What the webhook reads of each image's CUDA, and from where: its tag, or (cuda.registry on) its config in its
    registry, read here and now. Exit 1 when any is unknown."""
    settings = _settings(args.config)
    images = ImageConfigs(settings.cuda.registry, background=False) if settings.cuda.registry.enabled else None
    unknown = 0
    for image in args.images:
        declared = cuda_version.declared_cuda(
            {"name": "c", "image": image}, {}, settings.cuda.image_references, images.lookup if images else None
        )
        if declared.requirement is not None:
            line = f"{declared.version_text} (from {declared.source})"
            if branches := cuda_version.forward_branches(declared.requirement):
                line += f"; also on data-center GPUs of driver branches {', '.join(branches)} (forward compatibility)"
            if cuda_version.is_minor_compatible(declared.requirement) and declared.version is not None:
                table = driver_table(settings.cuda)
                floor, own = table.minor_floor.get(declared.version[0]), table.minimum_driver(declared.version)
                if floor is not None and (own is None or floor < own):  # 13.0's floor is its own driver: no more
                    line += f"; also on drivers >= {show_driver(floor)} (minor-version compatibility)"
        elif declared.disabled:
            line = f"not checked ({declared.source})"
        else:
            unknown += 1
            line = f"CUDA unknown ({declared.error or declared.source or 'no rule reads its tag'})"
            if images is None and not declared.error:
                line += "; cuda.registry.enabled would read its config"
        print(f"{image}: {line}")
    return 1 if unknown else 0


def build_parser() -> argparse.ArgumentParser:
    from webhook.server import ServeOptions

    parser = argparse.ArgumentParser(prog="gpu-admission", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the webhook over HTTPS with gunicorn")
    serve.add_argument("--config", help="settings file (YAML)")
    serve.add_argument("--nodes", help="node list file instead of the live cluster")
    serve.add_argument("--cert", default="/tls/tls.crt", help="serving certificate, PEM (default %(default)s)")
    serve.add_argument(
        "--key", default="/tls/tls.key", help="its key, PEM; both are reloaded when they change (default %(default)s)"
    )
    ServeOptions.add_arguments(serve, port=8443, metrics_port=9090)
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser(
        "check-config", help="load a settings file as serve does and exit (2, saying why, where serve would refuse it)"
    )
    check.add_argument("--config", required=True, help="settings file (YAML)")
    check.add_argument(
        "--absent-registry-files",
        action="store_true",
        help="pass a cuda.registry credentialsFile or caFile that is not there (one that is, is read as serve reads"
        " it): the chart's hook, whose optional volumes are empty until the Secret or ConfigMap exists",
    )
    check.set_defaults(func=cmd_check_config)

    review = sub.add_parser(
        "review",
        help="show what the webhook would do with a manifest",
        description="Review each Pod and workload of the manifest: one object, or a stream of them (helm template, "
        "kustomize build; documents and kind: List items, at every depth), other kinds passed over and named on "
        "stderr. Exit 0 when every one is admitted; 1 when one is denied, or is a workload whose pods the webhook "
        "would each refuse as they are created (PODS DENIED: the webhook admits the workload itself, or passes it "
        "over for a reason of its own, such as an exempt creator), or whose pods pass untouched, or where MIG "
        "conversion is off, and stay Pending (PODS PENDING: a gpu-memory size left unconverted) or run with no GPU "
        "(PODS GET NO GPU: the gpu-fraction annotation left unconverted; a Pod: PENDING, GETS NO GPU), or one the API "
        "server would refuse (DENIED by the API server: a nvidia.com/gpu fraction the webhook leaves in it); 2 when "
        "one could not be reviewed, or none is there. -o json prints one object {allowed, message, warnings, patch, "
        "object}, a workload's with podsAllowed, podsRefused, podsPending and podsWithoutGpu (and podsWarnings, "
        "where the webhook passes it over), a Pod's with podsPending or podsWithoutGpu where it has such lines, one "
        "the API server would refuse with apiServerRefuses; for an input of several objects, a list of "
        "them, each with its kind, name and namespace.",
    )
    review.add_argument(
        "-f", "--file", required=True, help="a Pod or workload manifest, or several (YAML or JSON; - for stdin)"
    )
    review.add_argument("--nodes", required=True, help="node list (kubectl get nodes -o yaml)")
    review.add_argument("--config")
    review.add_argument("--namespace")
    review.add_argument("-o", "--output", choices=["text", "json"], default="text")
    review.set_defaults(func=cmd_review)

    pools = sub.add_parser("pools", help="show how the webhook sees a cluster's GPU pools")
    pools.add_argument("--nodes", required=True)
    pools.add_argument("--config")
    pools.add_argument("-o", "--output", choices=["text", "json"], default="text")
    pools.set_defaults(func=cmd_pools)

    image = sub.add_parser("image", help="show the CUDA the webhook reads of images (their tag, their config)")
    image.add_argument("images", nargs="+", metavar="IMAGE", help="image references, as a pod names them")
    image.add_argument("--config", help="settings file (YAML): cuda.registry there reads configs from registries")
    image.set_defaults(func=cmd_image)

    certs_cli.register(sub)
    selftest.register(sub)
    return parser


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging() -> None:
    """Log lines as ``LOG_FORMAT`` says. Records do not look up their caller or thread, which no format here shows
    ("Optimization" in Python's logging HOWTO): a sixth of a record's cost (11.2 -> 9.5 us), and the Events relay
    writes one per Event when there is no cluster to send them to. The process id stays: gunicorn's log lines show
    it."""
    logging._srcfile = None  # no sys._getframe walk per record
    logging.logThreads = False
    logging.logMultiprocessing = False
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except (ConfigError, InputError) as err:
        print(f"gpu-admission: {err}", file=sys.stderr)
        return EXIT_UNUSABLE
    except BrokenPipeError:
        # the reader went away (`| head`): no traceback; what was left unwritten goes nowhere, as the shell's
        # own tools do (their exit status is then 141, SIGPIPE's)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:  # the output cannot be written (a full disk): not "denied"
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"gpu-admission: {err}", file=sys.stderr)
        return EXIT_UNUSABLE
    return code


if __name__ == "__main__":
    sys.exit(main())
