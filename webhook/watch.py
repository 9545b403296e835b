"""The live cluster source: a list-and-watch of Nodes with the ``kubernetes`` client, folded into ClusterViews.

One ``LiveCluster`` per process. gunicorn forks its workers and threads do not survive a fork, so ``start()`` is
called in each worker after the fork (``GunicornServer.load``, which then waits for the first list); a ``start()``
in a process other than the one that started the threads begins afresh. Two daemon threads:

- the *watcher* lists Nodes (in pages), then watches from the list's resourceVersion with bookmarks; a watch that
  ends is resumed from the last resourceVersion seen; a 410 Gone (an ERROR event on the stream, or the status of the
  watch request) means the apiserver no longer has that history, and a 504 ResourceVersionTooLarge that it is behind
  that version (etcd restored from a backup), so it lists again; any other failure (a dropped
  stream, an unreachable apiserver, a 5xx) is retried with capped, jittered exponential backoff. A connection that
  died unseen (a NAT's or load balancer's drop without a reset) is broken by TCP keepalive within a minute
  (``http1.KEEPALIVE_IDLE_S``), and the watch resumed. Every ``resync_seconds`` it lists again whatever the watch
  says.
- the *builder* folds the node objects into an immutable ClusterView (``build_view``) at most every
  ``debounce_seconds``, so a burst of thousands of node events costs a few rebuilds, and swaps it in atomically.

``ready()`` is False until the first list has succeeded (a log line says so, and another when synced); after that it
stays True while the apiserver is unreachable, with the last snapshot (its age is ``snapshot_age_seconds``, for
metrics): failing readiness on every replica at once would block every GPU pod in the cluster. Nothing raises out
of the threads.

Node objects stay plain dicts (``_preload_content=False``): no round trip through ``V1Node`` models.
"""

from __future__ import annotations

import datetime
import enum
import errno
import functools
import hashlib
import json
import logging
import os
import queue
import random
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from webhook import http1
from webhook.cluster import ClusterView, Node, build_view, parse_node, same_node
from webhook.config import Settings
from webhook.errors import ConfigError
from webhook.model import as_dict, as_list, as_str

log = logging.getLogger("gpu_admission.cluster")

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
ApiClientFactory = Callable[[], Any]
"""Returns a new ``kubernetes.client.ApiClient``; called in the watcher thread (after the fork), again after errors
of the connection or of the credentials (``credentials_refused``)."""


class _Gone(Exception):
    """410 Gone: the resourceVersion is too old; list again."""


class _TooLarge(Exception):
    """504 ResourceVersionTooLarge: the resourceVersion is newer than the API server's; list again."""


class _StreamError(Exception):
    """The watch stream reported an error other than 410."""


class _Listed(enum.Enum):
    """What the last list of nodes tells of a watch's 403 (``LiveCluster._watch_loop``): whether the RBAC lets list
    nodes and not watch them."""

    NO = "no"
    """It failed (a periodic relist, the watch going on): a 403 to the watch is trouble, said as such."""
    BEFORE = "before"
    """It worked before this watch: a 403 may be passing (a binding deleted and made again, an HA API server whose
    RBAC cache lags) or the list refused too since, so the list is asked again at once, before saying either."""
    ASKED = "asked"
    """It is asked again at once, after a watch's 403."""
    AGAIN = "again"
    """It worked when asked again after a watch's 403: a 403 to the next watch too, the RBAC forbids the watch alone."""


class CredentialsHung(Exception):
    """Loading the API client's credentials has not returned in time (``InTime``)."""


T = TypeVar("T")


def _cut(err: BaseException) -> bool:
    """The stream itself broke (a reset, an end before its last chunk, a read that timed out): not an answer of the
    API server's, which a retry without a pause would only repeat."""
    import urllib3

    return isinstance(err, (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError, ConnectionError))


RELIST_RETRY_S = 60.0
"""A periodic relist that failed is tried again after this long (or its Retry-After), the watch going on meanwhile."""
WATCH_HELD_S = 10.0
"""A watch stream open at least this long that then breaks is resumed at once, without a backoff."""
RETRY_AFTER_MAX_S = 60.0
FIRST_LIST_READ_S = 30.0
"""How long the first list's first try waits for the API server's answer (each page's), before it is said and tried
again: until it succeeds the webhook is not ready. An API server that takes a request and does not answer was waited
on 120 s, and asked again by urllib3, 4 minutes with nothing logged. Each try that timed out doubles the next one's
wait, up to ``LIST_READ_S``: at 30 s for good, an API server whose list took 40 s was never listed."""
LIST_READ_S = 120.0
"""How long a later list (every ``resync_seconds``) waits for each page: the watch goes on meanwhile."""
CREDENTIALS_TIMEOUT_S = 60.0
"""How long loading the API client's credentials may take: a kubeconfig's exec credential plugin (``aws eks
get-token``, ``kubelogin``) is run by the kubernetes client with no timeout, on each new client and at each token
refresh, and one that hung stopped the node watch for good, unsaid."""


def _read_timed_out(err: BaseException) -> bool:
    """Whether a request timed out waiting for the API server's answer (urllib3's error, or its cause once urllib3
    gave up)."""
    import urllib3

    cause = err.reason if isinstance(err, urllib3.exceptions.MaxRetryError) else err
    return isinstance(cause, urllib3.exceptions.ReadTimeoutError)


def _status(err: BaseException) -> int | None:
    """The HTTP status an error of the API carries (410 for an expired watch's ERROR event); None for others."""
    return 410 if isinstance(err, _Gone) else getattr(err, "status", None)


def _too_large(status: Mapping[str, Any]) -> bool:
    """Whether an API Status says the resourceVersion asked for is newer than the API server's (504, its cause
    ResourceVersionTooLarge; older servers said only "Too large resource version"): it is behind the version held,
    etcd restored from a backup, and a watch from it would be refused again and again. client-go's reflector lists
    again on it (isTooLargeResourceVersionError)."""
    causes = as_list(as_dict(status.get("details")).get("causes"))
    return status.get("code") == 504 and (
        any(as_dict(cause).get("reason") == "ResourceVersionTooLarge" for cause in causes)
        or "Too large resource version" in as_str(status.get("message"))
    )


def _relist_why(err: BaseException) -> str | None:
    """Why only a new list can go on after ``err``, for the log; None when the watch can be resumed."""
    if _status(err) == 410:
        # The apiserver no longer holds the history from our resourceVersion (compaction, restart): only a new list
        # tells what changed meanwhile.
        return "the node watch's history expired (410 Gone)"
    if isinstance(err, _TooLarge):
        return "resource version too large (API server restored or behind)"
    if _status(err) == 504 and _too_large(as_dict(_json(getattr(err, "body", None)))):
        return "resource version too large (API server restored or behind)"
    return None


def credentials_refused(err: BaseException) -> bool:
    """Whether the API server refused the client's credentials, which a new client loads again (a kubeconfig's exec
    plugin run again): a 401, or a 403 to no credentials at all (``system:anonymous``: the kubernetes client sends
    none where its exec plugin failed). Not another 403: that is RBAC, the same for a new client, and each retry
    rebuilt the client, a kubeconfig's exec plugin run again at every one."""
    status = _status(err)
    message = as_str(as_dict(_json(getattr(err, "body", None))).get("message"))
    return status == 401 or (status == 403 and '"system:anonymous"' in message)


def _retry_after(err: BaseException) -> float:
    """An API answer's Retry-After, in seconds (at most ``RETRY_AFTER_MAX_S``); 0 when it names none."""
    headers = getattr(err, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return min(max(float(value), 0.0), RETRY_AFTER_MAX_S) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


class Backoff:
    """Capped exponential backoff with full jitter (the delay is uniform in [base/2, base])."""

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        self.initial = initial
        self.maximum = maximum
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        base = min(self.maximum, self.initial * float(2 ** min(self.failures, 30)))
        self.failures += 1
        return base / 2 + self._rng.random() * base / 2

    def reset(self) -> None:
        self.failures = 0


FILES_CHECK_S = 1.0
"""How often at most the node watch (``LiveCluster._look_at_files``) and the Events relay (``ApiSink._fresh``) look
whether their kubeconfig was rewritten: a stat and a hash of each file (``file_stamps``)."""


FileStamp = tuple[int, int, int, bytes]
"""A file's inode, mtime, size and a hash of its bytes (``file_stamps``)."""


def file_stamps(paths: tuple[str, ...]) -> tuple[FileStamp | None, ...]:
    """Each file's inode, mtime, size and a hash of its bytes (None: missing or unreadable): whether it was rewritten
    since (``Rewritten``), and which kubeconfig a load read (``InTime``'s ``stamp``). Inode, mtime and size alone
    were the same for other contents (rewritten in place as long, its mtime kept: ``cp -p``; ext4 reuses an inode
    freed by a rename over it): the rewrite unseen, and a load given up on before it taken for its (found by a
    review). A kubeconfig is a few KiB: read and hashed once per ``FILES_CHECK_S`` at most, off the request path."""
    found: list[FileStamp | None] = []
    for path in paths:
        try:
            with open(os.path.expanduser(path), "rb") as file:
                stat = os.fstat(file.fileno())
                digest = hashlib.blake2b(file.read(), digest_size=16).digest()
        except OSError:
            found.append(None)
        else:
            found.append((stat.st_ino, stat.st_mtime_ns, stat.st_size, digest))
    return tuple(found)


class Rewritten:
    """Whether the files that credentials are read from (a kubeconfig's) were rewritten on disk (a Secret's mount,
    k3s) since ``read``: each one's stamp (``file_stamps``; None: missing), looked at once per ``every`` seconds at
    most. The node watch and the Events relay make their API client anew where they were."""

    def __init__(self, paths: tuple[str, ...], every: float = 0.0) -> None:
        self.paths = paths
        self.every = every
        self._lock = threading.Lock()
        self._stamps = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[FileStamp | None, ...]:
        return file_stamps(self.paths)

    def read(self) -> None:
        """The files as they are now are those the client is made from."""
        with self._lock:
            self._stamps, self._checked = self._stat(), time.monotonic()

    def changed(self) -> bool:
        """Whether they changed since read, or since said changed: True once for each change, to one caller."""
        if not self.paths or time.monotonic() - self._checked < self.every:
            return False
        with self._lock:
            stamps, self._checked = self._stat(), time.monotonic()
            if stamps == self._stamps:
                return False
            self._stamps = stamps
            return True


class LiveCluster:
    """A ClusterSource that follows the cluster's Nodes. ``snapshot()`` never blocks and never calls the API."""

    def __init__(
        self,
        settings: Settings,
        api_client_factory: ApiClientFactory,
        *,
        description: str = "the API server",
        debounce_seconds: float = 0.5,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        watch_timeout_seconds: int = 300,
        page_size: int = 500,
        connect_timeout: float = 10.0,
        loader: Callable[[], tuple[str, str]] = lambda: ("its credentials loader", ""),
        credentials_files: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        self.factory = api_client_factory
        self.description = description
        self.debounce_seconds = debounce_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.watch_timeout_seconds = max(1, watch_timeout_seconds)
        self.page_size = page_size
        self.connect_timeout = connect_timeout
        self.loader = loader
        """What loads the client's credentials and what tells its runs apart, read at each new client (``_loader``:
        the kubeconfig's exec plugin, with its command line and env)."""
        self.credentials = loader()[0]
        """What loaded the client's credentials, for the log: the kubeconfig's exec plugin, with its command."""
        self.credentials_files = credentials_files
        """The files the factory reads the credentials from (the kubeconfig's): rewritten on disk (a Secret's mount,
        k3s), the client is made anew from them."""
        self.credentials_timeout = CREDENTIALS_TIMEOUT_S
        self.resync_seconds = max(1, settings.cluster.resync_seconds)
        self._timestamp_labels = frozenset(settings.cluster.timestamp_labels)
        self._pid: int | None = None
        self._reset()

    def _reset(self) -> None:
        """Fresh state for this process (locks held by threads of the parent are not inherited safely)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._dirty = threading.Event()
        self._nodes: dict[str, Node] = {}
        self._rv = ""
        self._synced = threading.Event()
        """Set by the first view built from a list: ``ready()``, and what ``wait_ready`` waits for."""
        self._view = build_view(
            [], self.settings, source=f"live watch of {self.description} (not synced yet)", synced=False
        )
        self._threads: list[threading.Thread] = []
        self._response: Any = None
        self._started_at = time.monotonic()
        self._fresh_at: float | None = None
        self._published_at: float | None = None
        self._failing_since: float | None = None
        """Since when the builds fail (then the view is behind the nodes, watch or not); None while they succeed."""
        self._watching = False
        self._opened_at: float | None = None
        """When the watch now open was opened; None while none is."""
        self._last_list = 0.0
        self._resync_at = 0.0
        """When the next periodic relist is due (``resync_seconds`` after the last list; sooner after one failed)."""
        self._generation = 0
        self._published = -1
        self._made: tuple[object, str] | None = None
        """The server and the credentials' loader (``loader``'s key) of the client last made (``_new_client``)."""
        self._in_times: dict[str, InTime] = {}
        """Loads of the client's credentials, each waited on ``credentials_timeout`` seconds at most: one ``InTime``
        per loader (``loader``'s key). One for the watch's life, named by the plugin seen at start, refused each load
        while that plugin hung, those of a kubeconfig rewritten to another plugin (or another env) too: the view
        stayed stale until the old plugin returned (found by a review)."""
        self._files = Rewritten(self.credentials_files, every=FILES_CHECK_S)
        """``credentials_files`` as the client was made from them."""
        self._rewritten = threading.Event()
        """``_files`` were seen rewritten while a watch was open (``_look_at_files``): the watch loop makes its client
        anew."""
        self._slow_lists = 0
        """First lists that timed out waiting for an answer: the next waits longer (``_list_read_s``)."""
        self._trouble: tuple[float, str] | None = None
        """(since when, the last error) while the watch fails; None while it works."""
        self._forbidden: str | None = None
        """Why the watch is forbidden (a 403 to it), while it is; None once a watch is let open."""
        self._watch_refused = False
        """The trouble held is a watch refused (403): a list that works does not end it (a false 'works again')."""
        self.builds = 0
        """Views built since start (for tests and metrics)."""
        self.lists = 0
        """Successful full lists since start."""

    # -- ClusterSource ------------------------------------------------------------------------------------------
    def snapshot(self) -> ClusterView:
        return self._view

    def ready(self) -> bool:
        return self._synced.is_set()

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first list; whether it has succeeded."""
        return self._synced.wait(timeout)

    def problem(self) -> str | None:
        """What keeps the view from being current, for /readyz: before the first list, how long it has waited and
        the last error; after it, the watch's last error and since when, or that the watch is forbidden (the relists
        working); None while it works."""
        trouble, now = self._trouble, time.monotonic()
        if not self._synced.is_set():
            waited = f"no node list from {self.description} in {now - self._started_at:.0f}s"
            return f"{waited}: {trouble[1]}" if trouble is not None else f"{waited}: waiting on its answer"
        opened = self._opened_at
        if trouble is None or (opened is not None and now - opened >= WATCH_HELD_S):
            return (
                self._forbidden
            )  # a watch open a while, if quiet, works (``_working`` is said once it brings or ends)
        return f"the node view cannot be refreshed from {self.description} for {now - trouble[0]:.0f}s: {trouble[1]}"

    def start(self) -> None:
        """Start the threads in this process (idempotent; after a fork, starts afresh in the child)."""
        if self._pid == os.getpid() and any(t.is_alive() for t in self._threads):
            return
        self._reset()
        self._pid = os.getpid()
        log.info(
            "cluster: listing nodes from %s; /readyz reports not ready until the first list succeeds",
            self.description,
        )
        for name, target in (("node-watch", self._watch_loop), ("node-view", self._build_loop)):
            thread = threading.Thread(target=self._guard(target), name=f"gpu-admission-{name}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._interrupt()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    # -- metrics ------------------------------------------------------------------------------------------------
    @property
    def snapshot_age_seconds(self) -> float:
        """How stale the snapshot may be: 0 while a watch is open, else the time since the nodes were last known
        current (since start when they never were)."""
        now = time.monotonic()
        if self._failing_since is not None:  # the nodes are known, the view is not built from them
            return now - (self._published_at if self._published_at is not None else self._started_at)
        if self._watching:
            return 0.0
        return now - (self._fresh_at if self._fresh_at is not None else self._started_at)

    @property
    def node_count(self) -> int:
        return self._view.node_count

    # -- threads ------------------------------------------------------------------------------------------------
    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    target()
                    return
                except Exception:  # never let the thread die: log and go on
                    log.exception("cluster: unexpected error in the node watch; continuing")
                    self._stop.wait(1.0)

        return run

    def _watch_loop(self) -> None:
        backoff = Backoff(self.backoff_initial, self.backoff_max)
        client: Any = None
        need_list = True
        unproven = False  # credentials other than those the nodes were listed with: listed again at once
        listed = _Listed.NO
        gone_streak = 0
        while not self._stop.is_set():
            delay = 0.0
            phase, began = "list", 0.0
            try:
                if client is not None and (self._rewritten.is_set() or self._files.changed()):
                    # kept across an RBAC 403 (its exec plugin not run again at each retry), the client is made anew
                    # where its kubeconfig was rewritten (to a user the RBAC lets): else it never recovered. New
                    # credentials (another user, another server) are unproven: the nodes are listed again at once,
                    # and what the old ones were refused (a forbidden watch) is not said of them
                    log.info("cluster: %s changed; loading its credentials again", ", ".join(self.credentials_files))
                    fresh = self._reloaded()
                    if fresh is not None:
                        _close(client)
                        client, unproven = fresh, True
                if client is None:
                    # one made anew after an error, from a kubeconfig rewritten meanwhile to another server (or
                    # user), watched the new server from the old one's resourceVersion, unlisted: the view kept the
                    # old server's nodes under the new one's name (found by a review)
                    made = self._made
                    client = self._new_client()
                    unproven = self._made != made
                if unproven:
                    need_list, listed, unproven = True, _Listed.NO, False
                    self._forbidden, self._watch_refused = None, False
                from kubernetes import client as k8s

                core = k8s.CoreV1Api(client)
                if need_list or time.monotonic() >= self._resync_at:
                    try:
                        self._list(core)
                    except Exception as err:
                        if need_list or not self._rv or self._stop.is_set() or _status(err) == 410:
                            raise
                        # The periodic relist failed (the API server's rate limits charge a list of every node far
                        # more than a watch; a 5xx; a slow list) while the watch may work: watching on from the
                        # version held, listing again later. Before, the loop listed and listed and never
                        # watched: no node change reached the view while the lists failed.
                        retry = max(_retry_after(err), min(self.resync_seconds, RELIST_RETRY_S))
                        self._resync_at = time.monotonic() + retry
                        listed = _Listed.NO
                        log.warning(
                            "cluster: the periodic relist of nodes from %s failed: %s; watching on, listing again in"
                            " %.0fs",
                            self.description,
                            brief(err),
                            retry,
                        )
                    else:
                        need_list = False
                        listed = _Listed.AGAIN if listed is _Listed.ASKED else _Listed.BEFORE
                        backoff.reset()
                        if not self._watch_refused:  # a watch refused says nothing works until one is let open
                            self._working()
                phase = "watch"
                began = time.monotonic()
                events, early = self._watch(core)
                if events:
                    backoff.reset()
                    gone_streak = 0
                elif early and not self._stop.is_set() and not self._rewritten.is_set():
                    delay = backoff.next()  # a stream that closes at once, again and again: do not hammer
            except Exception as err:
                if self._stop.is_set():
                    break
                if self._rewritten.is_set():  # the watch ended for it (``_look_at_files``): no trouble
                    continue
                status = _status(err)
                relist = _relist_why(err)
                if relist is not None:
                    log.info("cluster: %s: listing again", relist)
                    need_list = True
                    gone_streak += 1
                    delay = backoff.next() if gone_streak > 1 else 0.0
                elif phase == "watch" and _cut(err) and time.monotonic() - began >= WATCH_HELD_S:
                    # A stream that was open a while and then broke (a load balancer's idle cut, a restarted API
                    # server, a connection that died unseen, broken by TCP keepalive): resumed at once from the
                    # version held. Counted as a failure, it drove the backoff to its maximum on a quiet cluster,
                    # node changes reaching the view up to 30 s late.
                    log.info("cluster: the node watch from %s ended (%s); resuming it", self.description, brief(err))
                    backoff.reset()
                elif (
                    phase == "watch"
                    and status == 403
                    and (listed is _Listed.AGAIN or (listed is _Listed.BEFORE and self._forbidden is not None))
                ):
                    # RBAC that grants list on nodes and not watch (a ClusterRole made by hand): each relist worked
                    # and said the watch worked again, the snapshot's age stayed under its alert, and nothing told.
                    # Only where a list asked after a watch's 403 worked (or since the watch was said forbidden):
                    # where the list is refused too (a ClusterRoleBinding deleted), that is said as trouble, at once;
                    # a single 403 is not said forbidden (found by reviews)
                    delay = max(backoff.next(), _retry_after(err))
                    self._watch_forbidden(err)
                elif phase == "watch" and status == 403 and listed is _Listed.BEFORE:
                    # the list worked before this watch: is it still let? asked at once, before saying either
                    self._resync_at = time.monotonic()
                    listed = _Listed.ASKED
                else:
                    delay = max(backoff.next(), _retry_after(err))
                    state = "" if self._synced.is_set() else "; not ready"
                    error = f"cannot {phase} nodes: {brief(err)}"
                    if status in (401, 403) and self.credentials.startswith(EXEC_PLUGIN):
                        # the plugin's own error, where it failed, is on a line of the kubernetes client's
                        error += f" (the credentials of {self.credentials})"
                    since = self._trouble[0] if self._trouble is not None else time.monotonic()
                    self._trouble = (since, error)
                    self._watch_refused = phase == "watch" and status == 403
                    log.warning("cluster: %s from %s%s; retrying in %.1fs", error, self.description, state, delay)
                    if not isinstance(err, _StreamError) and (status is None or credentials_refused(err)):
                        _close(client)
                        client = None  # a new client reloads credentials and connections
            if phase == "watch" and listed is _Listed.AGAIN:
                listed = _Listed.BEFORE
            if delay:
                self._stop.wait(delay)
        _close(client)

    def _watch_forbidden(self, err: BaseException) -> None:
        """The API server forbade the watch of nodes, which it lets list: said at WARNING once, and by ``problem``
        until a watch is let open (``_watch``)."""
        first = self._forbidden is None
        self._trouble, self._watch_refused = None, False  # said as what it is instead
        self._forbidden = (
            f"the node watch is forbidden ({brief(err)}): the RBAC lets list nodes and not watch them, so node changes"
            f" reach the view only at each relist, every {self.resync_seconds}s; add `watch` to the verbs of the"
            " ClusterRole rule for nodes bound to the webhook's service account (the chart's grants list and watch)"
        )
        if first:
            log.warning("cluster: %s from %s", self._forbidden, self.description)

    def _working(self) -> None:
        """A list that the API server answered, or a watch that brought an event or a bookmark or was open
        ``WATCH_HELD_S``: the watch works (again). Not a watch that opened and failed at once, again and again (an
        ERROR 500 on the stream: etcd in trouble), which said it worked again at each retry, /readyz's time failing
        never past the backoff."""
        if self._trouble is not None:
            log.info(
                "cluster: the node watch works again: %s answers, after failing for %.0fs",
                self.description,
                time.monotonic() - self._trouble[0],
            )
            self._trouble = None
        self._watch_refused = False

    def _new_client(self) -> Any:
        """A new API client, its credentials loaded in time (``_in_times``, by the loader the kubeconfig names now),
        and loaded again in the same time at each refresh (``_InTimeRefresh``)."""
        self._rewritten.clear()
        self._files.read()
        loader = self.loader()
        in_time = InTime.of(self._in_times, loader, self.credentials_timeout, self._stop)
        client = in_time(self.factory, stamp=file_stamps(self.credentials_files))
        _InTimeRefresh.install(getattr(client, "configuration", None), in_time)
        self.credentials = in_time.what
        host = getattr(getattr(client, "configuration", None), "host", None)
        self._made = (host, loader[1])
        named = kubeconfig_server(host, self.credentials_files) if isinstance(host, str) else self.description
        if self.credentials_files and named != self.description:
            # a kubeconfig rewritten to another server: the log, /readyz and the view's source named the old one
            self.description = named
            with self._lock:
                self._generation += 1  # the next list publishes a view whose source names it
        return client

    def _reloaded(self) -> Any | None:
        """A new client from the rewritten ``credentials_files``; None where they cannot be loaded (half-written in
        place, a typo): said at WARNING, the client there is and its watch kept, and loaded again at their next
        change (where the same exec plugin hangs, the client there fails too, its token refreshed by that plugin:
        said so). The client was closed before the new one was made, and the watch that worked ended within a second,
        the nodes then not listed at each retry, the view frozen (found by a review)."""
        try:
            return self._new_client()
        except Exception as err:
            if self._stop.is_set():
                raise
            if isinstance(err, CredentialsHung) and self._made is not None and self.loader()[1] == self._made[1]:
                # the client there refreshes its token in the time of the same plugin: it fails at once too (it was
                # said to go on: found by a review)
                then = (
                    "the node watch fails with it: the credentials loaded before are refreshed by the same plugin,"
                    " before each request; it is loaded again at each retry, and the watch resumes once the plugin"
                    " answers"
                )
            else:
                then = (
                    "the node watch goes on with the credentials loaded before, and it is loaded again once rewritten"
                )
            log.warning(
                "cluster: the kubeconfig %s, rewritten, cannot be loaded (%s): %s",
                os.pathsep.join(self.credentials_files),
                brief(err),
                then,
            )
            return None

    def _list(self, core: Any) -> None:
        started = time.monotonic()
        nodes: dict[str, Node] = {}
        token: str | None = None
        rv = ""
        while True:
            kwargs: dict[str, Any] = {
                "limit": self.page_size,
                "_preload_content": False,
                "_request_timeout": (self.connect_timeout, self._list_read_s()),
            }
            if token:
                kwargs["_continue"] = token
            try:
                response = core.list_node(**kwargs)
            except Exception as err:
                if _read_timed_out(err) and not self._synced.is_set():
                    self._slow_lists += 1
                raise
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
            meta = as_dict(as_dict(body).get("metadata"))
            for item in as_list(as_dict(body).get("items")):
                node = parse_node(item)
                if node is not None:
                    nodes[node.name] = node
            rv = as_str(meta.get("resourceVersion")) or rv
            token = as_str(meta.get("continue")) or None
            if not token:
                break
        first = not self._synced.is_set()
        with self._lock:
            held = self._nodes
            same = not first and self._same_nodes(held, nodes)
            self._nodes = held if same else nodes
            self._rv = rv
            if not same:
                self._generation += 1
            behind = self._published < self._generation  # a build that failed since: a list mends it
        self._last_list = time.monotonic()
        self._resync_at = self._last_list + self.resync_seconds
        self._fresh_at = self._last_list
        self.lists += 1
        if behind:
            self._publish()  # at once: readiness follows the first list, not the debounce
        if first:
            view = self._view
            log.info(
                "cluster: synced %d nodes (%d GPU groups in %d pools) from %s in %.2fs; ready",
                view.node_count,
                len(view.gpu_groups),
                len({g.pool for g in view.gpu_groups}),
                self.description,
                time.monotonic() - started,
            )

    def _list_read_s(self) -> float:
        """How long a list waits for each page: the first list ``FIRST_LIST_READ_S`` at its first try, doubled at
        each try that timed out, up to ``LIST_READ_S``, which later lists wait."""
        if self._synced.is_set():
            return LIST_READ_S
        return min(LIST_READ_S, FIRST_LIST_READ_S * 2.0 ** min(self._slow_lists, 10))

    def _watch(self, core: Any) -> tuple[int, bool]:
        """Follow one watch request until it ends: (events it brought, whether it ended at once and empty)."""
        timeout = max(1, min(self.watch_timeout_seconds, int(self._resync_at - time.monotonic()) + 1))
        started = time.monotonic()
        response = core.list_node(
            watch=True,
            resource_version=self._rv or None,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
            # above timeoutSeconds: a quiet watch may bring nothing for its whole life (kube-apiserver's watch cache
            # sends a bookmark only once its resourceVersion passed the one the watch began from, and on a quiet
            # node set that takes minutes); a connection that died unseen is found by TCP keepalive instead
            _request_timeout=(self.connect_timeout, timeout + 30),
        )
        self._response = response
        self._watching = True
        self._opened_at = started
        if self._forbidden is not None:
            log.info("cluster: the node watch is let open again by %s", self.description)
            self._forbidden = None
        count = 0
        try:
            if self._stop.is_set() or self._rewritten.is_set():
                return 0, False
            for line in _lines(response):
                if self._stop.is_set() or self._rewritten.is_set():
                    break
                self._apply(line)
                # an event or a bookmark: every change up to it has come (an ERROR raised above and is no news)
                self._fresh_at = time.monotonic()
                if not count:
                    self._working()
                count += 1
            # ended as the API server ends a watch (its timeoutSeconds): the view was current until now; a stream
            # that broke or failed was current up to its last event or bookmark
            self._fresh_at = time.monotonic()
        finally:
            self._watching = False
            self._opened_at = None
            self._response = None
            if time.monotonic() - started >= WATCH_HELD_S:
                self._working()  # it was open a while, whatever ended it
            try:
                response.close()
                response.release_conn()
            except Exception:
                pass
        return count, count == 0 and time.monotonic() - started < 1.0

    def _same_nodes(self, held: dict[str, Node], listed: dict[str, Node]) -> bool:
        """Whether a list found the nodes held, as ``_apply`` compares one (a relist every resync finds them)."""
        return held.keys() == listed.keys() and all(
            same_node(held[name], node, self._timestamp_labels) for name, node in listed.items()
        )

    def _apply(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError as err:
            raise _StreamError(f"unreadable watch event: {line[:80]!r}") from err
        kind = as_str(as_dict(event).get("type"))
        obj = as_dict(as_dict(event).get("object"))
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            if _too_large(obj):
                raise _TooLarge()
            raise _StreamError(f"{obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        meta = as_dict(obj.get("metadata"))
        rv = as_str(meta.get("resourceVersion"))
        name = as_str(meta.get("name"))
        with self._lock:
            if kind in ("ADDED", "MODIFIED") and name:
                node = parse_node(obj)
                held = self._nodes.get(name)
                if node is not None and held is not None and same_node(held, node, self._timestamp_labels):
                    # what changed is nothing a view holds (conditions, heartbeats, images, a label's order) or
                    # a labeller's timestamp: no new snapshot, so the stores of answers and templates on the one
                    # in place are kept, and no rebuild (at 10,000 nodes 0.13 s of CPU, the requests' GIL) runs
                    if rv:
                        self._rv = rv
                    return
                if node is not None:
                    self._nodes[name] = node
            elif kind == "DELETED" and name:
                self._nodes.pop(name, None)
            elif kind != "BOOKMARK":
                return
            if rv:
                self._rv = rv
            if kind != "BOOKMARK":
                self._generation += 1
        if kind != "BOOKMARK":
            self._dirty.set()

    def _build_loop(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._look_at_files()
            if not self._dirty.wait(timeout=1.0):
                continue
            wait = last + self.debounce_seconds - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            if self._stop.is_set():
                break
            if self._synced.is_set():
                self._publish()
            else:
                self._dirty.clear()
            last = time.monotonic()

    def _publish(self) -> None:
        """Build a view from the current nodes and swap it in (a reference assignment: atomic for readers); a view
        built from older nodes than the one in place (the two threads raced) is dropped."""
        with self._lock:
            self._dirty.clear()
            nodes = list(self._nodes.values())
            generation = self._generation
        try:
            view = build_view(nodes, self.settings, source=f"live watch of {self.description}")
        except Exception:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
            raise
        with self._lock:
            if generation < self._published:
                return
            self._published = generation
            self._published_at = time.monotonic()
            self._failing_since = None
            self._view = view
            self.builds += 1
        self._synced.set()

    def _look_at_files(self) -> None:
        """While a watch is open, whether ``credentials_files`` were rewritten (once a second at most: a stat and a
        hash of each): the watch is ended, and the watch loop makes its client anew from them. A watch brings nothing
        for minutes on a quiet cluster, and the files were looked at only between watches: a kubeconfig rewritten to
        another server left the view with the old server's nodes, watched, until its watch ended (found by a
        review)."""
        if self._watching and self._files.changed():
            self._rewritten.set()  # before the interrupt: a watch opened meanwhile sees it (``_watch``)
            self._interrupt()

    def _interrupt(self) -> None:
        """Unblock a watcher waiting on the stream (shut the socket down, as kubernetes.watch.Watch.stop does)."""
        response = self._response
        if response is None:
            return
        try:
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


INTIME_IDLE_S = 60.0
"""How long ``InTime``'s helper thread waits for a call before it ends."""

KEPT_S = 300.0
"""How long after it came at most the answer of a load given up on is the next load's (``InTime._kept``): older
credentials are loaded anew (a token revoked meanwhile, a plugin's cache refreshed)."""


class InTime:
    """Calls that load an API client's credentials (``call()``), each in a helper thread (one for all: ``_hand``) and
    waited on ``timeout`` seconds at most (``CREDENTIALS_TIMEOUT_S``); past that, ``CredentialsHung``, which names
    ``what`` loads them: the caller warns and retries. A call that hung is left running (its plugin cannot be stopped
    from here), and no other is begun while it runs: a plugin that hangs is one process, not one more per retry. A
    call made while another runs in its time waits on that one. Once a call outlasted its time, the calls are begun
    (one at a time) and not waited on, until one returns in time again, or one that outlasted it returns an answer
    (``_answered``): a plugin slower than the timeout at each run (kubelogin with nobody at the browser exits after
    180 s) held up its callers (the Events relay) at each retry after a run ended, for good (found by a review); and
    a refresh after one that hung once, then answered, failed at once, its Events with it (found by a review). The
    answer of a load given up on is kept for the next load of the same files (``stamp``): it was thrown away, and the
    plugin known to be slow run again (found by a review). The loads of the node watch (``LiveCluster.loader``) and
    of the Events relay (``load_kubeconfig``'s ``in_times``) have one per plugin, its command, args and env: a
    kubeconfig rewritten to another plugin is loaded while the old one hangs. The watch's client refreshes its token
    in the time of the plugin that loaded it, each of the relay's clients in one of its own."""

    @classmethod
    def of(
        cls, kept: dict[str, InTime], loader: tuple[str, str], timeout: float, stop: threading.Event | None = None
    ) -> InTime:
        """The ``InTime`` of ``loader`` (``_loader``'s what and key) in ``kept``, made there at its first load."""
        what, key = loader
        if key not in kept:
            kept[key] = cls(what, timeout, stop)
        return kept[key]

    def __init__(self, what: str, timeout: float, stop: threading.Event | None = None) -> None:
        self.what = what
        self.timeout = timeout
        self.stop = stop or threading.Event()
        """Set, the wait ends at once (``LiveCluster.stop``)."""
        self._held: tuple[float, Future[Any], object] | None = None
        """The last call begun, when, and its ``stamp``; one still running is not begun again."""
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        """The helper thread that runs the calls (``_hand``), while it waits on them; None once it has ended."""
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._slow = False
        """A wait gave up on a call, and no call has returned in time since: calls are not waited on."""
        self._returned = 0.0
        """When the last call returned (``time.monotonic``): the age of ``_late``'s answer."""
        self._late: Future[Any] | None = None
        """The call a wait gave up on last, or begun and not waited on (``_slow``), until the next call takes its
        answer (``_kept``) or is begun: thrown away, the answer of one begun so had the plugin run again (found by a
        review)."""

    def __call__(self, call: Callable[[], T], join: bool = True, stamp: object = None) -> T:
        """``call``'s result in time. ``join`` False: a call made while another runs in its time fails at once
        (``CredentialsHung``), where it would wait on that one: a load into a configuration of its own
        (``load_kubeconfig``), which the other call does not fill. Joined, it returned without error, its
        configuration never loaded (found by a review). ``stamp``: the kubeconfig files a load reads, as they are
        (``file_stamps``); the answer of a load given up on is this one's where their stamps are equal (``_kept``).
        None: not kept (a refresh, whose answer is in its configuration already)."""
        future: Future[T]
        with self._lock:
            held = self._held
            kept = self._kept(stamp)
            if kept is not None:
                return cast("T", kept.result())
            if held is None or held[1].done():
                future = Future()
                began = time.monotonic()
                self._held = (began, future, stamp)
                self._late = None
                self._hand(call, future)
                if self._slow:  # begun, its result unwaited: if it returns in time, the next call is waited on
                    self._late = future  # and its answer is the next load's, as one given up on is
                    raise self._hung()
            elif self._slow or time.monotonic() - held[0] >= self.timeout:
                raise self._hung()
            elif not join:
                raise CredentialsHung(f"{self.what} is running already, for another load: not run twice at once")
            else:
                # the same load, begun by another thread in its time (the relay's senders refresh the token at once,
                # and the client's refresh is not made for two at once): waited on, its result theirs, outside the
                # lock (the helper thread takes it to end when idle: a caller that waited holding it kept the
                # helper from the call it waited on, until its time ran out)
                began, future, _ = held
        return self._wait(began, future)

    def _kept(self, stamp: object) -> Future[Any] | None:
        """The load given up on last, taken by this one (``stamp``): it returned at last with an answer (``_answered``:
        a plugin that failed past its time gives none, nor one whose token the client refreshes at once), ``KEPT_S``
        ago at most, and read the files as they are (a kubeconfig rewritten meanwhile, to another server, is loaded
        anew); under ``_lock``."""
        held = self._held
        if stamp is None or held is None or held[1] is not self._late or held[2] != stamp or not held[1].done():
            return None
        self._late = None  # taken once: the next load runs the plugin
        if held[1].exception() is not None or not _answered(held[1].result()):
            return None
        return held[1] if time.monotonic() - self._returned <= KEPT_S else None

    def _hung(self) -> CredentialsHung:
        """That the call hangs, in the same words when a wait gives up on it and at each call while it runs: said
        once (``events.CredentialLoads``). It was said twice in a row, in two wordings (found by a review)."""
        return CredentialsHung(
            f"{self.what} has not returned in {self.timeout:.0f}s; run one at a time, and not waited on until it"
            " returns in time (run it by hand where the webhook runs to see why it hangs)"
        )

    def _hand(self, call: Callable[[], Any], future: Future[Any]) -> None:
        """``call`` to the helper thread, started when none waits (at the first call, after a fork, after it was idle
        ``INTIME_IDLE_S``); under ``_lock``. One thread for all the calls, as one runs at a time: a thread started for
        each cost each of the Events relay's Events 80-180 us, its token valid or not."""
        if self._worker is None or not self._worker.is_alive():
            self._calls = queue.SimpleQueue()
            self._worker = threading.Thread(target=self._work, name="gpu-admission-credentials", daemon=True)
            self._worker.start()
        self._calls.put((call, future))

    def _work(self) -> None:
        calls = self._calls
        while True:
            try:
                call, future = calls.get(timeout=INTIME_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if calls.empty():  # else a call was handed meanwhile, to this thread
                        self._worker = None
                        return
                continue
            began = time.monotonic()
            try:
                result, error = call(), None
            except BaseException as err:
                result, error = None, err
            self._returned = time.monotonic()
            if self._returned - began <= self.timeout or (error is None and _answered(result)):
                self._slow = False  # it returns in time again, or answered at last: the next call is waited on
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def _wait(self, began: float, future: Future[T]) -> T:
        while not self.stop.is_set():
            left = began + self.timeout - time.monotonic()
            if wait([future], timeout=min(1.0, max(0.0, left))).done:
                return future.result()
            if left <= 0:
                self._slow = True
                self._late = future
                raise self._hung()
        raise CredentialsHung("stopped while loading credentials")


def _answered(result: Any) -> bool:
    """Whether a call of ``InTime`` gave credentials: a load's API client or configuration holds a token or a client
    certificate, a refresh (``_InTimeRefresh._refresh``) returns its configuration where it got a new token. The
    kubernetes client logs a plugin that failed and loads on without its credentials (a refresh keeps the expired
    token): a run that failed past its time (kubelogin, nobody at the browser) returns as one that answered. A token
    the client refreshes before its next request (``_refreshed_at_once``) is none: taken as one, a late answer's
    token valid 60 s was kept, and each request ran the plugin, slower than its time at each run, and failed, the
    relay's Events with it; and the next load was waited on, the relay held up at every other Event (found by a
    review). Where reading the client's internals raises (a later client's naive expiry against an aware now), no
    answer: raised in ``InTime``'s worker, it ended the thread, its call never answered, and each later load and
    refresh of the plugin failed as hung, for good and unsaid (found by a review)."""
    cfg = getattr(result, "configuration", result)
    try:
        return bool(getattr(cfg, "api_key", None) or getattr(cfg, "cert_file", None)) and not _refreshed_at_once(cfg)
    except Exception:  # whatever the client's internals hold
        return False


def _refreshed_at_once(cfg: Any) -> bool:
    """Whether the kubernetes client refreshes the token of a client configuration before its next request:
    its expiry, which the kubeconfig's loader keeps (its refresh hook is a closure over it), is within the client's
    margin (``EXPIRY_SKEW_PREVENTION_DELAY``, 5 minutes). No expiry (a token that does not expire, a client
    certificate): False."""
    from kubernetes.config.kube_config import EXPIRY_SKEW_PREVENTION_DELAY

    hook = getattr(cfg, "refresh_api_key_hook", None)
    hook = hook.hook if isinstance(hook, _InTimeRefresh) else hook
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            expiry = vars(cell.cell_contents).get("expiry")
        except (TypeError, ValueError):  # an empty cell, or what holds no attributes
            continue
        if isinstance(expiry, datetime.datetime):
            return expiry - EXPIRY_SKEW_PREVENTION_DELAY <= datetime.datetime.now(datetime.UTC)
    return False


class _InTimeRefresh:
    """A client configuration's ``refresh_api_key_hook``, run in time (``InTime``). The kubernetes client calls the
    hook before each request; the kubeconfig's runs an exec plugin again once its token has expired (every ~10
    minutes for an EKS token) and, as the in-cluster one, installs itself anew on every call: this one keeps the hook
    so installed and puts itself back. Installed once per client, it bounded only the client's first request, and a
    plugin that hung at a token refresh stopped the node watch (and the Events relay) for good, unsaid."""

    def __init__(self, hook: Callable[[Any], None], in_time: Callable[[Callable[[], Any]], Any]) -> None:
        self.hook = hook
        self.in_time = in_time

    @classmethod
    def install(cls, cfg: Any, in_time: Callable[[Callable[[], Any]], Any]) -> None:
        hook = getattr(cfg, "refresh_api_key_hook", None)
        if hook is not None and not isinstance(hook, cls):  # a configuration shared by clients is bounded once
            cfg.refresh_api_key_hook = cls(hook, in_time)

    def __call__(self, cfg: Any) -> None:
        self.in_time(lambda: self._refresh(cfg))

    def _refresh(self, cfg: Any) -> Any | None:
        """``cfg`` where the hook gave it a new token (its plugin answered: ``_answered``), else None. In the helper
        thread, so that a hook that returns late still puts this one back."""
        before = dict(getattr(cfg, "api_key", None) or {})
        try:
            self.hook(cfg)
        finally:
            installed = getattr(cfg, "refresh_api_key_hook", None)
            if installed is not self and installed is not None:
                self.hook = installed
            cfg.refresh_api_key_hook = self
        return cfg if (getattr(cfg, "api_key", None) or {}) != before else None


def _lines(response: Any) -> Iterator[str]:
    """Newline-delimited JSON events from a watch response (a chunk may hold part of a line or several)."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk if isinstance(chunk, bytes) else str(chunk).encode()
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")


BRIEF_MAX = 400
"""A log line's error is cut to this many characters, its cause first and the URL last."""
_WHERE_PREFIX = re.compile(r"^(<[^<>]*>|HTTPS?Connection(Pool)?\([^()]*\)): ")
"""urllib3's errors begin with the connection or the pool they came from (the URL is said last instead)."""


def brief(err: BaseException) -> str:
    """An error of the API or of the connection, for the log: its cause first (the API's ``message``, which says
    what a 403 forbade to whom; a refused connection, a name not resolved, a TLS failure), the URL last."""
    status = getattr(err, "status", None)
    if status:
        message = as_str(as_dict(_json(getattr(err, "body", None))).get("message"))
        said = f"HTTP {status} {getattr(err, 'reason', None) or ''}".strip()
        return _clip(f"{said}: {message}" if message else said)
    broke = _broken_open(err)
    if broke is not None:
        if broke == errno.ETIMEDOUT:
            return (
                "its connection was found dead, its TCP keepalive probes unanswered: dropped on the way without a"
                " reset by a NAT or load balancer, or the API server's host gone"
            )
        return f"its connection was found dead, the API server's host or network unreachable ({os.strerror(broke)})"
    import urllib3

    cause = err.reason if isinstance(err, urllib3.exceptions.MaxRetryError) else None  # what failed, at last
    text = _said(cause if isinstance(cause, BaseException) else err)
    if isinstance(err, urllib3.exceptions.RequestError) and getattr(err.pool, "host", None):
        text += f" ({getattr(err.pool, 'scheme', 'https')}://{err.pool.host}:{err.pool.port}{err.url or ''})"
    return _clip(text)


def _said(err: BaseException) -> str:
    """What an exception says, without the connection or pool urllib3 begins it with; its arguments joined (urllib3's
    ProtocolError holds its cause as its second)."""
    parts = [_WHERE_PREFIX.sub("", str(arg)) for arg in err.args if isinstance(arg, (str, BaseException))]
    return ": ".join(p for p in parts if p) or str(err) or type(err).__name__


def _clip(text: str) -> str:
    return text if len(text) <= BRIEF_MAX else text[:BRIEF_MAX] + "..."


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, (str, bytes)) and text else None
    except ValueError:
        return None


def _broken_open(err: BaseException) -> int | None:
    """The errno with which the kernel broke a connection that was open (``http1.DEAD_ERRNOS``: its keepalive probes
    unanswered, or answered unreachable), which urllib3 reports as a read that failed; None for anything else: its
    own read timeout (no errno), and a connection that could not be made (the same errnos, told by urllib3 as what
    they are: "Failed to establish a new connection")."""
    import urllib3

    found = None
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)):
            return None
        if found is None and isinstance(cause, OSError) and cause.errno in http1.DEAD_ERRNOS:
            found = cause.errno
        cause = cause.__cause__ or cause.__context__
    return found


def _close(client: Any) -> None:
    try:
        if client is not None:
            client.close()
    except Exception:
        pass


# ---------------------------------------------------------------------------------------------------------------
# Credentials


def _api_connections(cfg: Any) -> None:
    """The connections of the API clients' urllib3: TCP keepalive (``http1.keepalive_options``: a watch whose
    connection died unseen breaks within a minute and is resumed; without it, it looked open and brought nothing
    until its read timed out, timeoutSeconds + 30 s later). And their retries: no answer asked again (urllib3's
    default: 3 tries, each 429 or 503 with a Retry-After slept through, unlogged, the loop blind meanwhile), as the
    watch loop retries, logs, and waits as Retry-After says (``_retry_after``); a connection error or a kept
    connection the server closed tried once more on a new one (a reused connection a server or proxy closed would
    otherwise be a warning and a backoff); a read that timed out not asked again (the loop says it and retries)."""
    import urllib3
    from urllib3.exceptions import ReadTimeoutError

    class Retry(urllib3.Retry):
        def increment(self, *args: Any, **kwargs: Any) -> Retry:
            # A read that timed out is not asked again: the API server took the request and did not answer, and
            # asking again doubled the wait (an API server that never answered the first list: 4 minutes unsaid)
            error = kwargs.get("error", args[3] if len(args) > 3 else None)
            retry = self.new(read=0) if isinstance(error, ReadTimeoutError) else self
            return urllib3.Retry.increment(retry, *args, **kwargs)

    cfg.socket_options = http1.keepalive_options()
    cfg.retries = Retry(
        total=2,  # and no other error asked again: with other=None a TLS failure was retried without end, unseen
        connect=1,
        read=1,
        status=0,
        redirect=0,
        other=0,
        respect_retry_after_header=False,
        raise_on_status=False,
    )


def kubeconfig_candidates(environ: Mapping[str, str] | None = None) -> list[str]:
    """Where kubeconfig files are looked for, there or not: ``KUBECONFIG`` (a path list), else ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    raw = env.get("KUBECONFIG")
    return [p for p in raw.split(os.pathsep) if p] if raw else [str(Path("~/.kube/config").expanduser())]


def kubeconfig_paths(environ: dict[str, str] | None = None) -> list[str]:
    """Existing kubeconfig files (``kubeconfig_candidates``)."""
    return [p for p in kubeconfig_candidates(environ) if Path(p).expanduser().is_file()]


def credentials_found(environ: dict[str, str] | None = None) -> bool:
    """Whether ``live_cluster_from_environment`` finds credentials to load (it loads nothing)."""
    env = os.environ if environ is None else environ
    return _in_cluster(env) or bool(kubeconfig_paths(dict(env)))


def credentials_files(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The files that the credentials found are loaded from, to be loaded again once rewritten (``Rewritten``): the
    kubeconfig's; none in a cluster (the kubernetes client reads a rotated service-account token itself)."""
    env = os.environ if environ is None else environ
    return () if _in_cluster(env) else tuple(kubeconfig_paths(dict(env)))


def _in_cluster(env: Mapping[str, str]) -> bool:
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and Path(SERVICE_ACCOUNT_TOKEN).is_file()


def live_cluster_from_environment(settings: Settings, environ: dict[str, str] | None = None) -> LiveCluster | None:
    """In-cluster credentials (a pod's service account), else the standard kubeconfig; None when neither exists.
    Raises ConfigError when the credentials exist but cannot be loaded. Connects nothing: call ``start()``."""
    from kubernetes import client, config

    env = os.environ if environ is None else environ
    if _in_cluster(env):
        try:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except config.ConfigException as err:
            raise ConfigError(f"in-cluster credentials: {err}") from err

        _api_connections(cfg)

        def in_cluster() -> Any:
            return client.ApiClient(cfg)  # the loader refreshes the rotated service-account token

        return LiveCluster(settings, in_cluster, description=f"in-cluster API server {cfg.host}")
    paths = kubeconfig_paths(dict(env))
    if not paths:
        return None
    joined = os.pathsep.join(paths)

    def from_kubeconfig() -> Any:
        cfg = client.Configuration()
        # Loaded again for each new client, so that exec-plugin and OIDC tokens are fresh.
        config.load_kube_config(config_file=joined, client_configuration=cfg)  # type: ignore[no-untyped-call]
        check_tls(cfg)
        _api_connections(cfg)
        return client.ApiClient(cfg)

    try:
        probe = load_kubeconfig(joined)
    except CredentialsHung as err:
        raise ConfigError(f"kubeconfig {joined}: {err}") from err
    except (config.ConfigException, OSError, ValueError) as err:
        raise ConfigError(f"kubeconfig {joined}: {err}") from err
    return LiveCluster(
        settings,
        from_kubeconfig,
        description=kubeconfig_server(probe.host, tuple(paths)),
        loader=functools.partial(_loader, joined),
        credentials_files=tuple(paths),
    )


def kubeconfig_server(host: str, paths: tuple[str, ...]) -> str:
    """A kubeconfig's server as the node watch names it (the log, /readyz, the view's source)."""
    return f"{host} (kubeconfig {os.pathsep.join(paths)})"


def load_kubeconfig(config_file: str, in_times: dict[str, InTime] | None = None) -> Any:
    """A client configuration loaded by ``kubernetes.config.load_kube_config``, in time (``InTime``), as are the token
    refreshes of the clients made with it (``_InTimeRefresh``): the kubernetes client runs the kubeconfig's exec
    credential plugin with no timeout, and one that hung stopped the caller for good (the node watch at start; the
    Events relay, which then outlived the server; its later Events at a token refresh). Past
    ``CREDENTIALS_TIMEOUT_S``, ``CredentialsHung``, which names the plugin's command; the plugin is left running.
    Else raises what the loader raises. ``in_times``: the ``InTime`` of each loader (``_loader``: an exec plugin by
    its command line and env) that loads again share, made there at the first: a plugin still hung is not run again,
    and the load fails at once (the Events relay's retries, ``events.AwaitingCredentials``: each made its own, and
    ran the plugin again and waited on it in full). A load given up on that answers at last is the next load's, where
    the files are as it read them (``InTime``'s ``stamp``): each load fills a configuration of its own, so that the
    one given up on is kept."""
    from kubernetes import client, config

    in_time = InTime.of({} if in_times is None else in_times, _loader(config_file), CREDENTIALS_TIMEOUT_S)

    def load() -> Any:
        cfg = client.Configuration()
        config.load_kube_config(config_file=config_file, client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cfg

    cfg = in_time(load, join=False, stamp=file_stamps(tuple(config_file.split(os.pathsep))))
    # the token refreshes of its clients in time of their own: a refresh (a valid token's, which runs no plugin)
    # while a later load of the same plugin hung failed at once, and the Event with it
    _InTimeRefresh.install(cfg, InTime(in_time.what, CREDENTIALS_TIMEOUT_S))
    return cfg


def check_tls(cfg: Any) -> None:
    """``http1.UnreadableTLS`` where the TLS material of a loaded client configuration (its CA, its client certificate
    and key) cannot be read as the client reads it at each connection (``http1.tls_context``). The kubernetes
    client's loader reads none of it: a kubeconfig rewritten with a CA that is no certificate loaded, and the node
    watch closed its client that worked for one whose every list failed, and the Events relay counted its Event
    failed, unsaid. Both call it on what they load, so that such a kubeconfig is one that cannot be loaded: the
    credentials loaded before are kept, said at WARNING, and at start it is loaded again until it can be."""
    if urlsplit(cfg.host).scheme == "https":
        http1.tls_context(cfg)


def _loader(joined: str) -> tuple[str, str]:
    """What loads the credentials of the kubeconfig's current user, for the log, and what tells its runs apart
    (``load_kubeconfig``'s ``in_times``, ``LiveCluster.loader``): an exec plugin's command line and its ``env``. Told
    apart by the command line alone, a rewrite changing only the plugin's env (``aws eks update-kubeconfig
    --profile`` writes AWS_PROFILE there) was not run while the plugin as it was before hung (found by a review)."""
    plugin = _exec_plugin(joined)
    if plugin is None:
        return "the kubeconfig's credentials loader", ""
    command = [as_str(plugin.get("command"))] + [as_str(a) for a in as_list(plugin.get("args"))]
    what = f"{EXEC_PLUGIN} `{shlex.join(command)}`"
    return what, json.dumps([command, plugin.get("env")], default=str)


EXEC_PLUGIN = "the kubeconfig's exec credential plugin"


def _exec_plugin(joined: str) -> dict[str, Any] | None:
    """The exec credential plugin (``command``, ``args``, ``env``) of the kubeconfig's current user; None where it has
    none."""
    from kubernetes.config import kube_config

    try:
        _, context = kube_config.list_kube_config_contexts(config_file=joined)  # type: ignore[no-untyped-call]
        user = as_dict(as_dict(context).get("context")).get("user")
        merged = as_dict(kube_config.KubeConfigMerger(joined).config.value)  # type: ignore[no-untyped-call]
        for node in as_list(merged.get("users")):
            entry = as_dict(getattr(node, "value", node))  # each file's entries are held as ConfigNodes
            plugin = as_dict(as_dict(entry.get("user")).get("exec"))
            if entry.get("name") == user and plugin.get("command"):
                return plugin
    except Exception:  # the loader says what is wrong with the kubeconfig
        pass
    return None
