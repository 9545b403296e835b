"""Certificates for the webhook: issue a CA and a serving certificate, renew them, inject the CA bundle.

Modules:
    ``certs.issue``  pure: issue, read back, check and plan (reuse / create / renew / rotate); atomic file writes.
    ``certs.kube``   the Secret and the two webhook configurations, through the Kubernetes API (the Helm hook Job).
    ``certs.cli``    ``gpu-admission certs issue | ensure | show``.

Errors:
    GpuAdmissionError
    └── CertsError    a certificate task could not be done; the message names what (the CLI exits 1)
"""

from __future__ import annotations

from webhook.errors import GpuAdmissionError


class CertsError(GpuAdmissionError):
    """A certificate task failed: unreadable files, an API call refused, a webhook configuration that never came."""


__all__ = ["CertsError"]
