"""Errors, typed by who is at fault.

GpuAdmissionError
├── BadRequest        the caller sent something unusable: 4xx, a metav1.Status body (``admission.error_body``)
│   └── PayloadTooLarge   413
├── ConfigError       the settings file or environment is wrong: refuse to start, naming the key
└── InputError        an offline manifest or node list is unusable (``review`` exits 2)
"""


class GpuAdmissionError(Exception):
    """Base of every error this project raises on purpose."""


class BadRequest(GpuAdmissionError):
    """The HTTP request cannot be reviewed; answered with ``status`` and a JSON error body."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class PayloadTooLarge(BadRequest):
    status = 413


class ConfigError(GpuAdmissionError):
    """A setting is missing, unknown or of the wrong type; the message names the key."""


class InputError(GpuAdmissionError):
    """A manifest or node list given to the CLI cannot be used."""
