"""The mig policy (placeholder until its issue lands): pure functions of (pod, context)."""

from webhook.model import Context, Outcome, PodView


def mutate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Change the working copy of the pod and say why in ``out``."""


def validate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Check the final pod; record denials, warnings and events in ``out``."""
