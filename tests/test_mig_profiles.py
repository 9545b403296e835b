"""The MIG profile table (webhook/data/mig-profiles.yaml) against NVIDIA's MIG user guide, "Supported MIG profiles"."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.mig_profiles import derive, load_table, parse_name

# NVIDIA MIG user guide, "Supported MIG profiles": model -> profiles (name x max instances), compute slices of the GPU.
REFERENCE = {
    "A30-24GB": (4, {"1g.6gb": 4, "2g.12gb": 2, "4g.24gb": 1}),
    "A100-40GB": (7, {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}),
    "A100-80GB": (7, {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}),
    "H100-80GB": (7, {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}),
    "H100-NVL-94GB": (7, {"1g.12gb": 7, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1}),
    "H100-96GB/GH200-96GB/H20": (
        7,
        {"1g.12gb": 7, "1g.24gb": 4, "2g.24gb": 3, "3g.48gb": 2, "4g.48gb": 1, "7g.96gb": 1},
    ),
    "GH200-144GB": (7, {"1g.18gb": 7, "1g.36gb": 4, "2g.36gb": 3, "3g.72gb": 2, "4g.72gb": 1, "7g.144gb": 1}),
    "H200-141GB": (7, {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1}),
    "B200-180GB": (7, {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1}),
    "GB200-186GB": (7, {"1g.23gb": 7, "1g.47gb": 4, "2g.47gb": 3, "3g.93gb": 2, "4g.93gb": 1, "7g.186gb": 1}),
    "B300": (7, {"1g.34gb": 7, "1g.67gb": 4, "2g.67gb": 3, "3g.135gb": 2, "4g.135gb": 1, "7g.269gb": 1}),
    "GB300": (7, {"1g.35gb": 7, "1g.70gb": 4, "2g.70gb": 3, "3g.139gb": 2, "4g.139gb": 1, "7g.278gb": 1}),
    "RTX-PRO-6000-96GB": (4, {"1g.24gb": 4, "2g.48gb": 2, "4g.96gb": 1}),
    "RTX-PRO-5000-48GB": (2, {"1g.24gb": 2, "2g.48gb": 1}),
    "RTX-PRO-4500-32GB": (2, {"1g.16gb": 2, "2g.32gb": 1}),
}
# Memory eighths (the MIG user guide: memory is cut in eighths): by compute slices; 1g comes in a small (1/8) and a
# large (2/8) size on 7-slice GPUs; on 4-slice GPUs 1g is a quarter, on 2-slice GPUs a half.
EIGHTHS_7 = {"small-1g": 1, "large-1g": 2, 2: 2, 3: 4, 4: 4, 7: 8}
EIGHTHS_4 = {1: 2, 2: 4, 4: 8}
EIGHTHS_2 = {1: 4, 2: 8}


def models() -> dict[str, Any]:
    return {m.name: m for m in load_table().models}


def test_every_reference_model_is_in_the_table_and_nothing_else():
    assert set(models()) == set(REFERENCE)


@pytest.mark.parametrize("name", sorted(REFERENCE), ids=sorted(REFERENCE))
def test_profiles_instances_and_slices_match_the_reference(name):
    total, profiles = REFERENCE[name]
    model = models()[name]
    assert model.compute_slices == total
    assert {p: row.max_instances for p, row in model.profiles.items()} == profiles
    for p, row in model.profiles.items():
        assert (row.slices, row.gb, "") == parse_name(p)
        assert row.total_slices == total


@pytest.mark.parametrize("name", sorted(REFERENCE), ids=sorted(REFERENCE))
def test_memory_eighths_follow_the_reference(name):
    model = models()[name]
    ones = sorted(row.gb for row in model.profiles.values() if row.slices == 1)
    for row in model.profiles.values():
        if model.compute_slices == 2:
            expected = EIGHTHS_2[row.slices]
        elif model.compute_slices == 4:
            expected = EIGHTHS_4[row.slices]
        elif row.slices == 1:
            expected = EIGHTHS_7["small-1g" if row.gb == ones[0] else "large-1g"]
        else:
            expected = EIGHTHS_7[row.slices]
        assert row.eighths == expected, row.name


def test_a100_40gb_shares_as_the_reference_spells_them():
    m = models()["A100-40GB"]
    assert {p: r.eighths for p, r in m.profiles.items()} == {
        "1g.5gb": 1,
        "1g.10gb": 2,
        "2g.10gb": 2,
        "3g.20gb": 4,
        "4g.20gb": 4,
        "7g.40gb": 8,
    }
    assert [m.profiles[p].usable_mib for p in ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")] == [
        4864,
        9856,
        9856,
        19968,
        19968,
        40192,
    ]


@pytest.mark.parametrize(
    ("product", "memory_mib", "expected"),
    [
        pytest.param("NVIDIA-A30", 24576, "A30-24GB", id="a30"),
        pytest.param("NVIDIA-A100-SXM4-40GB", 40960, "A100-40GB", id="a100-sxm4-40"),
        pytest.param("NVIDIA-A100-PCIE-40GB", 40960, "A100-40GB", id="a100-pcie-40"),
        pytest.param("NVIDIA-A100-SXM4-80GB", 81920, "A100-80GB", id="a100-sxm4-80"),
        pytest.param("NVIDIA-A100-80GB-PCIe", 81920, "A100-80GB", id="a100-pcie-80"),
        pytest.param("NVIDIA-H100-80GB-HBM3", 81559, "H100-80GB", id="h100-hbm3"),
        pytest.param("NVIDIA-H100-PCIe", 81559, "H100-80GB", id="h100-pcie"),
        pytest.param("NVIDIA-H100-NVL", 95830, "H100-NVL-94GB", id="h100-nvl"),
        pytest.param("NVIDIA-H20", 97871, "H100-96GB/GH200-96GB/H20", id="h20"),
        pytest.param("NVIDIA-GH200-480GB", 97871, "H100-96GB/GH200-96GB/H20", id="gh200-96"),
        pytest.param("NVIDIA-GH200-144G-HBM3e", 146000, "GH200-144GB", id="gh200-144"),
        pytest.param("NVIDIA-GH200", 146000, "GH200-144GB", id="gh200-by-memory"),
        pytest.param("NVIDIA-H200", 143771, "H200-141GB", id="h200"),
        pytest.param("NVIDIA-H200-NVL", 143771, "H200-141GB", id="h200-nvl"),
        pytest.param("NVIDIA-B200", 183359, "B200-180GB", id="b200"),
        pytest.param("NVIDIA-GB200", 189471, "GB200-186GB", id="gb200"),
        pytest.param("NVIDIA-B300-SXM6-AC", 275040, "B300", id="b300"),
        pytest.param("NVIDIA-GB300", 284208, "GB300", id="gb300"),
        pytest.param("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", 97887, "RTX-PRO-6000-96GB", id="rtx-pro-6000"),
        # A800 / H800 (NVIDIA open-gpu-kernel-modules 560.31.02 README names; gpu-operator default MIG config)
        pytest.param("NVIDIA-A800-SXM4-80GB", 81920, "A100-80GB", id="a800-sxm4-80"),
        pytest.param("NVIDIA-A800-80GB-PCIe", 81920, "A100-80GB", id="a800-pcie-80"),
        pytest.param("NVIDIA-A800-80GB-PCIe-LC", 81920, "A100-80GB", id="a800-pcie-80-lc"),
        pytest.param("NVIDIA-A800-40GB-Active", 40960, "A100-40GB", id="a800-40-active"),
        pytest.param("NVIDIA-H800", 81559, "H100-80GB", id="h800"),
        pytest.param("NVIDIA-H800-PCIe", 81559, "H100-80GB", id="h800-pcie"),
        pytest.param("NVIDIA-H800-NVL", 95830, "H100-NVL-94GB", id="h800-nvl"),
        pytest.param("NVIDIA-H800-NVL", 0, "H100-NVL-94GB", id="h800-nvl-no-memory"),
        pytest.param("NVIDIA-H800", 0, "H100-80GB", id="h800-no-memory"),
        pytest.param("Tesla-T4", 15360, None, id="t4-no-mig"),
        pytest.param("", 0, None, id="no-product"),
    ],
)
def test_model_for_product(product, memory_mib, expected):
    model = load_table().model_for(product, memory_mib=memory_mib)
    assert (model.name if model else None) == expected


@pytest.mark.parametrize(
    ("accelerator", "expected"),
    [
        pytest.param("nvidia-tesla-a100", "A100-40GB", id="a100-40"),
        pytest.param("nvidia-a100-80gb", "A100-80GB", id="a100-80"),
        pytest.param("nvidia-h100-80gb", "H100-80GB", id="h100"),
        pytest.param("nvidia-rtx-pro-6000", "RTX-PRO-6000-96GB", id="rtx-pro-6000-g4"),
        pytest.param("nvidia-tesla-t4", None, id="t4"),
    ],
)
def test_model_for_gke_accelerator(accelerator, expected):
    model = load_table().model_for(accelerator=accelerator)
    assert (model.name if model else None) == expected


def test_model_from_offered_names_when_the_product_is_unknown():
    model = load_table().model_for(offered=["1g.5gb", "3g.20gb"])
    assert model is not None and model.name == "A100-40GB"
    assert load_table().model_for(offered=["1g.10gb", "3g.40gb"]) is not None  # A100-80GB and H100 rows agree
    assert load_table().model_for(offered=["5g.33gb"]) is None


@pytest.mark.parametrize(
    ("model", "name", "row"),
    [
        pytest.param("A100-80GB", "7g.79gb", "7g.80gb", id="7g.79gb-alias"),
        pytest.param("A100-80GB", "7g.80gb", "7g.80gb", id="exact"),
        pytest.param("A100-80GB", "1g.10gb.me", "1g.10gb", id="media-extension"),
        pytest.param("H100-80GB", "1g.10gb+me", "1g.10gb", id="plus-me"),
        pytest.param("H100-80GB", "1g.21gb", "1g.20gb", id="nearest-size"),
        pytest.param("H100-80GB", "1g.15gb", None, id="too-far"),
        pytest.param("H100-80GB", "garbage", None, id="garbage"),
    ],
)
def test_lookup_matches_driver_names_to_rows(model, name, row):
    found = models()[model].lookup(name)
    if row is None:
        assert found is None
    else:
        base = models()[model].profiles[row]
        assert found is not None and found.name == name
        assert (found.slices, found.gb, found.eighths) == (base.slices, base.gb, base.eighths)


@pytest.mark.parametrize(
    ("name", "full_gb", "total", "expected"),
    [
        pytest.param("3g.40gb", 80, 7, (3, 40, 4), id="by-memory"),
        pytest.param("1g.12gb", 94, 7, (1, 12, 1), id="odd-size"),
        pytest.param("2g.12gb", 0, 4, (2, 12, 4), id="4-slice-by-slices"),
        pytest.param("3g.20gb", 0, 0, (3, 20, 4), id="7-slice-by-slices"),
        pytest.param("9g.90gb", 0, 0, None, id="more-slices-than-gpu"),
        pytest.param("mig", 0, 0, None, id="not-a-profile"),
    ],
)
def test_derive_for_unknown_gpus(name, full_gb, total, expected):
    found = derive(name, full_gb, total)
    assert (None if found is None else (found.slices, found.gb, found.eighths)) == expected
