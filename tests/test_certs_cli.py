"""gpu-admission certs issue | ensure | show: exit 0 done, 1 failed (message names what), 2 bad usage."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from certs import issue as ci
from certs.cli import main
from tests.kubeapi import KubeAPI
from tests.test_certs_kube import MUTATING, VALIDATING, put_mutating, put_validating

ISSUE = ["certs", "issue", "--service", "gpu-admission", "--namespace", "gpu-admission"]


def sans_in(directory: Path) -> list[str]:
    return ci.sans(ci.load_certificates((directory / "tls.crt").read_bytes())[0])


def test_issue_then_reuse_without_touching_the_files(tmp_path, capsys):
    d = tmp_path / ".dev-certs"
    assert main([*ISSUE, "--dir", str(d)]) == 0
    assert "created" in capsys.readouterr().out
    mtimes = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    assert main([*ISSUE, "--dir", str(d)]) == 0  # `make run` twice does not churn
    assert capsys.readouterr().out.startswith(f"certs issue: reused {d} (valid for 365 more days); nothing written")
    assert mtimes == {p.name: p.stat().st_mtime_ns for p in d.iterdir()}


@pytest.mark.parametrize(
    ("flags", "dev_names"),
    [
        pytest.param([], True, id="default-includes-localhost"),
        pytest.param(["--dev"], True, id="dev"),
        pytest.param(["--no-dev"], False, id="no-dev"),
    ],
)
def test_issue_dev_names(tmp_path, flags, dev_names):
    assert main([*ISSUE, "--dir", str(tmp_path), *flags]) == 0
    names = sans_in(tmp_path)
    assert "gpu-admission.gpu-admission.svc" in names
    assert ("localhost" in names and "127.0.0.1" in names) is dev_names


def test_issue_renews_files_near_expiry_keeping_the_ca(tmp_path, capsys):
    old = ci.issue("gpu-admission", "gpu-admission", days=1, ca_days=3650, dev=True)
    ci.write_files(tmp_path, old)
    assert main([*ISSUE, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "renewed (CA kept)" in out and "expires in 1.0 days" in out and "wrote tls.key, tls.crt" in out
    assert (tmp_path / "ca.crt").read_bytes() == old.ca_crt  # a CA a developer trusted keeps working


def test_issue_adds_missing_dev_names(tmp_path):
    ci.write_files(tmp_path, ci.issue("gpu-admission", "gpu-admission"))
    assert main([*ISSUE, "--dir", str(tmp_path)]) == 0
    assert "localhost" in sans_in(tmp_path)


def test_issue_failure_exits_1_naming_the_directory(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*ISSUE, "--dir", str(blocker / "certs")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-admission certs: {blocker / 'certs'}: cannot") and "Not a directory" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["certs"], "required", id="no-subcommand"),
        pytest.param(["certs", "issue", "--dir", "x", "--service", "s"], "--namespace", id="missing-namespace"),
        pytest.param([*ISSUE[:3], "Not_A_Label", *ISSUE[4:], "--dir", "x"], "not a DNS label", id="bad-service"),
        pytest.param([*ISSUE, "--dir", "x", "--days", "0"], "at least 1", id="zero-days"),
        pytest.param([*ISSUE, "--dir", "x", "--days", "soon"], "whole number", id="days-not-a-number"),
        # its CA, ten times as long, went past the year 9999: an OverflowError's traceback
        pytest.param([*ISSUE, "--dir", "x", "--days", "300000"], "is over 36500 (a hundred years", id="days-past-9999"),
        pytest.param(
            [*ISSUE, "--dir", "x", "--days", "20"], "must be less than --days (20)", id="renew-window-too-big"
        ),
        pytest.param([*ISSUE, "--dir", "x", "--key-type", "dsa"], "invalid choice", id="bad-key-type"),
        pytest.param(["certs", "ensure", "--service", "s", "--namespace", "n"], "required", id="ensure-missing-flags"),
        pytest.param(["certs", "show"], "file", id="show-without-file"),
    ],
)
def test_bad_usage_exits_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_show(tmp_path, capsys):
    ci.write_files(tmp_path, ci.issue("gpu-admission", "gpu-admission", dev=True))
    assert main(["certs", "show", str(tmp_path / "tls.crt")]) == 0
    out = capsys.readouterr().out
    assert "subject:   CN=gpu-admission.gpu-admission.svc" in out
    assert "SANs:      gpu-admission, gpu-admission.gpu-admission," in out and "localhost, 127.0.0.1" in out
    assert "issuer:    CN=gpu-admission CA for gpu-admission.gpu-admission" in out and "days left: 365.0" in out


@pytest.mark.parametrize(
    ("name", "message"),
    [pytest.param("missing.crt", "cannot read", id="missing"), pytest.param("tls.key", "no PEM certificate", id="key")],
)
def test_show_failures_exit_1(tmp_path, capsys, name, message):
    ci.write_files(tmp_path, ci.issue("s", "n"))
    assert main(["certs", "show", str(tmp_path / name)]) == 1
    assert message in capsys.readouterr().err


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeAPI]:
    api = KubeAPI().start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", api.kubeconfig(str(tmp_path / "kubeconfig")))
    yield api
    api.stop()


ENSURE = [
    "certs", "ensure", "--namespace", "gpu-system", "--service", "gpu-admission", "--secret", "gpu-admission-tls",
    "--mutating-config", MUTATING, "--validating-config", VALIDATING,
]  # fmt: skip


def test_ensure_through_kubeconfig_then_idempotent(kubeconfig, capsys):
    put_mutating(kubeconfig)
    put_validating(kubeconfig)
    assert main(ENSURE) == 0
    first = capsys.readouterr().out.strip().splitlines()
    assert len(first) == 1 and first[0].startswith("Secret gpu-system/gpu-admission-tls created;")
    assert main(ENSURE) == 0
    second = capsys.readouterr().out.strip()
    assert "reused unchanged" in second and "caBundle set" not in second


def test_ensure_missing_configuration_exits_1(kubeconfig, capsys):
    put_mutating(kubeconfig)
    assert main([*ENSURE, "--wait-seconds", "1"]) == 1
    err = capsys.readouterr().err
    assert f"waiting for ValidatingWebhookConfiguration {VALIDATING!r}" in err
    assert f"gpu-admission certs: ValidatingWebhookConfiguration {VALIDATING!r} not found" in err


def test_ensure_without_credentials_exits_1(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(ENSURE) == 1
    assert "no Kubernetes credentials" in capsys.readouterr().err


def test_registered_in_the_main_command(tmp_path, capsys):
    from webhook.cli import build_parser

    args: Any = build_parser().parse_args([*ISSUE, "--dir", str(tmp_path)])
    assert args.func(args) == 0
    assert sorted(os.listdir(tmp_path)) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
