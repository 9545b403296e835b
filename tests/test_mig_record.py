"""The line a MIG conversion leaves (``webhook/policies/mig_record.py``): what is written reads back the same, and
a line is trusted no further than its format and the keys the webhook pins by."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.cluster import build_view
from webhook.config import Settings
from webhook.model import Context
from webhook.policies import mig_record as record
from webhook.policies.mig_record import Line

PRODUCT = "nvidia.com/gpu.product"
label_value = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
POOL = "cloud.google.com/gke-nodepool"
pins = st.tuples(st.sampled_from([PRODUCT, POOL]), st.lists(label_value, min_size=1, max_size=3))
lines = st.builds(
    Line,
    name=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
    asked=st.sampled_from(["nvidia.com/gpu 0.5", "nvidia.com/gpu 250m", "gpu-admission.io/gpu-memory 20Gi"]),
    given=st.one_of(
        st.sampled_from(["nvidia.com/mig-3g.40gb", "nvidia.com/gpu 1", "nvidia.com/gpu.shared 1"]),
        label_value.map(lambda v: f"nvidia.com/gpu 1 with nodeSelector {PRODUCT}={v}-MIG-3g.40gb"),
    ),
    note=st.sampled_from(["", record.WHOLE_NOTE, record.SHARED_NOTE, record.TOGETHER]),
    own=st.booleans(),
    pin=st.one_of(st.none(), pins.map(lambda p: (p[0], tuple(p[1])))),
    where=st.sampled_from(["NVIDIA-A100-SXM4-80GB, pool a100", "A, pools p, q or B, pool r", record.NOWHERE_NOW]),
    tolerated=st.booleans(),
    profile=st.sampled_from(["", "3g.40gb", "1g.10gb+me"]),
)


def _as_written(line: Line) -> Line:
    """What ``str`` writes of it: 'the pod's own nodeSelector' only beside a nodeSelector."""
    return replace(line, own=line.own and record.WITH_SELECTOR in line.given)


@given(lines)
def test_a_line_reads_back_as_written(line: Line) -> None:
    text = str(line)
    assert record.parse(text, [PRODUCT, POOL]) == _as_written(line)
    assert record.given_of(text) == line.given
    assert record.SEPARATOR not in text


@given(lines)
def test_a_pin_is_read_only_on_a_key_the_webhook_pins_by(line: Line) -> None:
    assert record.parse(str(line), ["nvidia.com/gpu.sharing-strategy"]).pin is None


def test_what_a_conversion_wrote_of_the_placement() -> None:
    pin = (PRODUCT, ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"))
    given_ = f"nvidia.com/gpu 1 with nodeSelector {PRODUCT}=NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    line = record.parse(str(Line("a", "nvidia.com/gpu 0.5", given_, pin=pin, where="x")), [PRODUCT])
    assert line.placement == {pin, (PRODUCT, ("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",))}
    assert line.asked_gpu == "0.5" and line.conversion
    own = record.parse(str(replace(line, own=True)), [PRODUCT])
    assert own.own and own.placement == {pin}


def test_lines_not_written_by_a_conversion() -> None:
    found = record.parse("trainer: nvidia.com/mig-1g.10gb (as found on the object)")
    assert (found.given, found.asked, found.conversion) == ("nvidia.com/mig-1g.10gb", "", False)
    assert not record.parse("trainer: rm -rf -> nvidia.com/mig-1g.10gb (x)").conversion
    assert record.parse("trainer: gpu-admission.io/gpu-memory 20Gi -> nvidia.com/mig-2g.20gb (x)").asked_gpu == ""


STORED = [
    # lines as the webhook writes them today, stored on live objects: a change of the format must still read them
    (
        "trainer: nvidia.com/gpu 0.25 -> nvidia.com/mig-1g.10gb (pinned to nvidia.com/gpu.product=NVIDIA-A100-SXM4-"
        "40GB or NVIDIA-A100-PCIE-40GB, NVIDIA-A100-SXM4-40GB, pool a100-40)",
        Line(
            "trainer",
            "nvidia.com/gpu 0.25",
            "nvidia.com/mig-1g.10gb",
            pin=(PRODUCT, ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB")),
            where="NVIDIA-A100-SXM4-40GB, pool a100-40",
        ),
    ),
    (
        "trainer: nvidia.com/gpu 0.5 -> nvidia.com/gpu 1 with nodeSelector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM"
        "3-MIG-3g.40gb (the pod's own nodeSelector, NVIDIA-H100-80GB-HBM3-MIG-3g.40gb, pool h100)",
        Line(
            "trainer",
            "nvidia.com/gpu 0.5",
            f"nvidia.com/gpu 1 with nodeSelector {PRODUCT}=NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
            own=True,
            where="NVIDIA-H100-80GB-HBM3-MIG-3g.40gb, pool h100",
        ),
    ),
    (
        "side: gpu-admission.io/gpu-memory 20Gi -> nvidia.com/gpu 1 (whole GPU: no MIG profile covers it, pinned to "
        "nvidia.com/gpu.sharing-strategy=none, NVIDIA-L4, pool l4)",
        Line(
            "side",
            "gpu-admission.io/gpu-memory 20Gi",
            "nvidia.com/gpu 1",
            record.WHOLE_NOTE,
            pin=("nvidia.com/gpu.sharing-strategy", ("none",)),
            where="NVIDIA-L4, pool l4",
        ),
    ),
    (
        "a: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb (the pod's fractions fit together only there, pinned to "
        "cloud.google.com/gke-nodepool=big, NVIDIA-A100-SXM4-80GB, pool big)",
        Line(
            "a",
            "nvidia.com/gpu 0.5",
            "nvidia.com/mig-3g.40gb",
            record.TOGETHER,
            pin=(POOL, ("big",)),
            where="NVIDIA-A100-SXM4-80GB, pool big",
        ),
    ),
    (
        "t: nvidia.com/gpu 0.4 -> nvidia.com/gpu 1 (MIG 3g.40gb, pinned to eks.amazonaws.com/nodegroup=a100-mig, "
        "NVIDIA-A100-SXM4-80GB, pool a100-mig)",
        Line(
            "t",
            "nvidia.com/gpu 0.4",
            "nvidia.com/gpu 1",
            pin=("eks.amazonaws.com/nodegroup", ("a100-mig",)),
            where="NVIDIA-A100-SXM4-80GB, pool a100-mig",
            profile="3g.40gb",
        ),
    ),
    (
        "t: nvidia.com/gpu 0.5 -> nvidia.com/gpu 1 with nodeSelector cloud.google.com/gke-gpu-partition-size=3g.40gb "
        "(the pod's fractions fit together only there, the pod's own nodeSelector, pinned to "
        "cloud.google.com/gke-nodepool=a or b, nvidia-a100-80gb, pools a, b)",
        Line(
            "t",
            "nvidia.com/gpu 0.5",
            "nvidia.com/gpu 1 with nodeSelector cloud.google.com/gke-gpu-partition-size=3g.40gb",
            record.TOGETHER,
            own=True,
            pin=(POOL, ("a", "b")),
            where="nvidia-a100-80gb, pools a, b",
        ),
    ),
]


@pytest.mark.parametrize(("text", "line"), STORED)
def test_lines_as_stored_today_read_and_write_the_same(text: str, line: Line) -> None:
    keys = [PRODUCT, POOL, "nvidia.com/gpu.sharing-strategy", "eks.amazonaws.com/nodegroup"]
    assert record.parse(text, keys) == line
    assert str(line) == text


def test_the_lines_of_an_annotation_by_container_the_first_of_each_name() -> None:
    words = {record.ANNOTATION: record.SEPARATOR.join([STORED[0][0], "b: x (y)", "trainer: later", "no colon"])}
    ctx = Context(settings=Settings(), cluster=build_view([], Settings()), prior=words)
    assert record.lines_of(ctx) == {"trainer": STORED[0][0], "b": "b: x (y)"}
    assert not record.stored(ctx, STORED[0][0])  # the object's words, not as stored
    ctx = replace(ctx, stored=words)
    assert record.stored(ctx, STORED[0][0]) and not record.stored(ctx, "trainer: forged")
