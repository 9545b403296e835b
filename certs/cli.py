"""``gpu-admission certs issue | ensure | show``: exit 0 on success, 1 when the task failed (the message says what),
2 on bad usage.

``webhook.cli`` calls ``register(subparsers)``; ``main(argv)`` runs these sub-commands alone.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from certs import CertsError
from certs.issue import Plan, describe, load_certificates, plan, read_files, write_files

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# RFC 1123 label: what Kubernetes accepts as a Service or Namespace name.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# RFC 1123 subdomain: Secret and webhook configuration names.
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _label(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a DNS label (lower-case letters, digits, '-'; <= 63)")
    return value


def _subdomain(value: str) -> str:
    if not _DNS_SUBDOMAIN.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a valid Kubernetes object name (RFC 1123 subdomain)")
    return value


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of days") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    if n > MAX_DAYS:
        raise argparse.ArgumentTypeError(
            f"{value} is over {MAX_DAYS} (a hundred years; the CA lasts ten times as long, and dates end at the year"
            " 9999)"
        )
    return n


MAX_DAYS = 36500
"""The longest serving certificate: its CA is made for ten times as long (``certs.issue.CA_LIFETIME_FACTOR``), and a
certificate's dates end at the year 9999."""


def _non_negative(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not n >= 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return n


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--service", required=True, type=_label, help="the webhook's Service name")
    p.add_argument("--namespace", required=True, type=_label, help="the Service's namespace")
    p.add_argument("--days", type=_positive_int, default=365, help="validity of a new serving certificate (365)")
    p.add_argument(
        "--renew-within-days",
        type=_non_negative,
        default=30,
        help="renew when the certificate expires within this many days (30); must be below --days",
    )
    p.add_argument("--key-type", choices=["ecdsa", "rsa"], default="ecdsa", help="ECDSA P-256 (default) or RSA 2048")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``certs`` with its sub-commands to an ``add_subparsers()`` object; each sets ``func(args) -> int``."""
    certs = subparsers.add_parser("certs", help="issue, renew and inspect the webhook's TLS certificates")
    sub = certs.add_subparsers(dest="certs_command", required=True, metavar="{issue,ensure,show}")

    issue = sub.add_parser(
        "issue",
        help="write ca.crt, tls.crt, tls.key (and ca.key) to a directory; reused while still valid",
        description="Development and non-cluster use. Includes localhost and 127.0.0.1 unless --no-dev.",
    )
    issue.add_argument("--dir", required=True, help="directory for the files (created 0700 when missing)")
    _common(issue)
    issue.add_argument(
        "--dev",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also valid for localhost and 127.0.0.1 (default: yes; --no-dev for cluster names only)",
    )
    issue.set_defaults(func=cmd_issue)

    ensure = sub.add_parser(
        "ensure",
        help="create or renew the serving Secret and inject the CA into the webhook configurations (Helm hook Job)",
    )
    _common(ensure)
    ensure.add_argument("--secret", required=True, type=_subdomain, help="the kubernetes.io/tls Secret")
    ensure.add_argument("--mutating-config", required=True, type=_subdomain, help="MutatingWebhookConfiguration")
    ensure.add_argument("--validating-config", required=True, type=_subdomain, help="ValidatingWebhookConfiguration")
    ensure.add_argument(
        "--wait-seconds",
        type=_non_negative,
        default=120,
        help="how long to wait for a webhook configuration that does not exist yet (120)",
    )
    ensure.add_argument(
        "--create-only",
        action="store_true",
        help="only create the Secret when it is missing (the chart's pre-install hook; caBundle injected later)",
    )
    ensure.set_defaults(func=cmd_ensure)

    show = sub.add_parser("show", help="print subject, SANs, issuer and days left of the certificates in a PEM file")
    show.add_argument("file")
    show.set_defaults(func=cmd_show)
    parser: argparse.ArgumentParser = certs
    return parser


def _usage(args: argparse.Namespace) -> str | None:
    if args.renew_within_days >= args.days:
        return (
            f"--renew-within-days ({args.renew_within_days:g}) must be less than --days ({args.days}), "
            "or every run would renew"
        )
    return None


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"gpu-admission certs: {message}", file=sys.stderr)
    return code


def _files_summary(directory: str, p: Plan, written: list[str]) -> str:
    if p.action == "reuse" and not written:
        return f"certs issue: reused {directory} ({p.reason}); nothing written"
    verb = {"create": "created", "reuse": "reused", "renew": "renewed (CA kept)", "rotate": "renewed with a new CA"}
    why = f" [{p.reason}]" if p.action in ("renew", "rotate") else ""
    return f"certs issue: {verb[p.action]} {directory}{why}; wrote {', '.join(written)}"


def cmd_issue(args: argparse.Namespace) -> int:
    if problem := _usage(args):
        return _fail(problem, EXIT_USAGE)
    try:
        current = read_files(args.dir)
        decided = plan(
            current,
            args.service,
            args.namespace,
            days=args.days,
            renew_within_days=args.renew_within_days,
            dev=args.dev,
            key_type=args.key_type,
        )
        written = write_files(args.dir, decided.bundle)
    except CertsError as err:
        return _fail(str(err))
    print(_files_summary(args.dir, decided, written))
    return EXIT_OK


def api_client_from_environment() -> Any:
    """In-cluster credentials (the Job's ServiceAccount), else the standard kubeconfig (``KUBECONFIG``)."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # untyped package
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as in_cluster:
        try:
            # KUBECONFIG read now, not when the kubernetes package was imported (it caches it then)
            config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
            )
        except (config.ConfigException, OSError, ValueError, yaml.YAMLError) as kubeconfig:  # ValueError: not UTF-8
            raise CertsError(
                f"no Kubernetes credentials: not in a cluster ({in_cluster}) and no usable kubeconfig ({kubeconfig})"
            ) from kubeconfig
    return client.ApiClient(configuration)


def cmd_ensure(args: argparse.Namespace) -> int:
    if problem := _usage(args):
        return _fail(problem, EXIT_USAGE)
    from certs.kube import ensure

    try:
        api_client = api_client_from_environment()
        with api_client:
            result = ensure(
                api_client,
                args.namespace,
                args.service,
                args.secret,
                args.mutating_config,
                args.validating_config,
                args.days,
                args.renew_within_days,
                key_type=args.key_type,
                wait_seconds=args.wait_seconds,
                create_only=args.create_only,
            )
    except CertsError as err:
        return _fail(str(err))
    print(result.summary())
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    try:
        pem = Path(args.file).read_bytes()
    except OSError as err:
        return _fail(f"{args.file}: cannot read: {err.strerror}")
    if not load_certificates(pem):
        return _fail(f"{args.file}: no PEM certificate in it")
    print("\n".join(describe(pem)))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-admission", description="certificates for the gpu-admission webhook")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``certs ...`` alone (``argv`` starts with ``certs``); returns the exit status, 2 for bad usage."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error (or --help)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
