"""Hardware catalog: numbers match /work/shared/facts/hardware.md; ids, aliases,
hardware files and efficiency-override files, with errors that name the field."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.perf import (
    EFFICIENCY_FIELDS,
    HARDWARE,
    Hardware,
    get_hardware,
    get_model,
    load_efficiency_overrides,
    load_hardware_file,
    with_overrides,
)
from kvsched.perf.hardware import (
    DEFAULT_ATTN_BW_FRAC,
    DEFAULT_COMM_BW_FRAC,
    DEFAULT_GEMM_MFU,
    DEFAULT_WEIGHT_BW_FRAC,
)

IDS = ("h100-sxm", "h100-pcie", "h200", "a100-80gb", "a100-40gb", "b200", "gb200", "l40s", "rtx-4090",
       "rtx-pro-6000", "rtx-6000-ada", "mi300x", "ascend-910b", "ascend-910c",
       "a10g", "l4", "h20", "mi325x", "mi355x", "b300", "gb300")

# Issue 23's GPUs, from their public datasheets (docs/catalogs.md, "Sources of
# the added GPUs"): mem BW TB/s, dense BF16 / FP8 / FP4 TFLOP/s, scale-up GB/s/dir.
ADDED: dict[str, tuple[float, float, float | None, float | None, float]] = {
    "a10g": (0.6, 70, None, None, 32),
    "l4": (0.3, 121, 242.5, None, 32),        # 242 / 485 with sparsity
    "h20": (4.0, 148, 296, None, 450),        # NVLink 900 bidirectional
    "mi325x": (6.0, 1307.4, 2614.9, None, 448),
    "mi355x": (8.0, 2516.6, 5033.2, 10066.3, 537.6),
    "b300": (8.0, 2250, 4500, 13500, 900),    # HGX B300: 108 PF dense FP4 / 8
    "gb300": (8.0, 2500, 5000, 15000, 900),   # NVL72: 1080 PF dense FP4 / 72
}

# hardware.md main table: visible GB, mem BW TB/s, BF16 TFLOP/s, FP8 TFLOP/s (None), scale-up GB/s/dir.
TABLE: dict[str, tuple[float, float, float, float | None, float]] = {
    "h100-sxm": (85.5, 3.35, 989.4, 1978.9, 450),
    "h100-pcie": (85.5, 2.0, 756, 1513, 64),          # PCIe5 x16 (bridge pairs only)
    "h200": (150.8, 4.8, 989.4, 1978.9, 450),
    "a100-80gb": (85.9, 2.039, 312, None, 300),
    "a100-40gb": (42.9, 1.555, 312, None, 300),
    "b200": (192.3, 7.7, 2250, 4500, 900),
    "gb200": (198.7, 8.0, 2500, 5000, 900),
    "l40s": (48.3, 0.864, 362.05, 733, 32),
    "rtx-4090": (25.8, 1.008, 165.2, 330.3, 32),       # FP32-accumulate column
    "rtx-pro-6000": (102.6, 1.792, 503.8, 1007.6, 64),
    "rtx-6000-ada": (51.5, 0.960, 364.2, 728.5, 32),
    "mi300x": (205.8, 5.3, 1307.4, 2614.9, 448),
    "ascend-910b": (68.7, 1.6, 353.9, None, 392),
    "ascend-910c": (137.4, 3.2, 752, None, 392),
}

# hardware.md aiconfigurator table, vLLM medians: gemm, fp8 gemm, weight BW, attn BW, prefill attn.
MEASURED: dict[str, tuple[float, float | None, float, float, float]] = {
    "h100-sxm": (0.79, 0.53, 0.87, 0.87, 0.56),
    "h200": (0.77, 0.60, 0.82, 0.82, 0.56),
    "a100-80gb": (0.91, None, 0.73, 0.74, 0.54),
    "b200": (0.69, 0.47, 0.80, 0.84, 0.49),
    "gb200": (0.51, 0.46, 0.79, 0.83, 0.46),
    "l40s": (0.61, 0.50, 0.83, 0.81, 0.45),
    "rtx-pro-6000": (0.80, 0.72, 0.83, 0.82, 0.53),
}


def _minimal(**extra: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "id": "my-gpu", "name": "My GPU", "memory_bytes": 80_000_000_000, "mem_bw": 2.0e12,
        "bf16_flops": 5.0e14, "fp8_flops": None, "scaleup_bw": 3.0e11, "scaleup_kind": "nvlink3",
    }
    fields.update(extra)
    return fields


def _write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _raises_naming(fn: object, *needles: str) -> str:
    assert callable(fn)
    with pytest.raises(ValueError) as info:
        fn()
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# -- catalog ------------------------------------------------------------------

@pytest.mark.parametrize("hw_id", sorted(ADDED))
def test_added_gpus_carry_their_datasheet_peaks(hw_id: str) -> None:
    bw, bf16, fp8, fp4, scaleup = ADDED[hw_id]
    hw = get_hardware(hw_id)
    assert hw.mem_bw == pytest.approx(bw * 1e12)
    assert hw.bf16_flops == pytest.approx(bf16 * 1e12)
    assert hw.fp8_flops == (None if fp8 is None else pytest.approx(fp8 * 1e12))
    assert hw.fp4_flops == (None if fp4 is None else pytest.approx(fp4 * 1e12))
    assert hw.scaleup_bw == pytest.approx(scaleup * 1e9)
    assert "approx" in hw.notes or "sheet" in hw.notes  # every added entry says where it stands


def test_catalog_has_exactly_the_listed_ids() -> None:
    assert tuple(HARDWARE) == IDS
    for hw_id, hw in HARDWARE.items():
        assert hw.id == hw_id
        assert get_hardware(hw_id) is hw
        assert hw.source and hw.notes, hw_id


@pytest.mark.parametrize("hw_id", sorted(TABLE))
def test_peaks_match_hardware_md(hw_id: str) -> None:
    hw = HARDWARE[hw_id]
    gb, bw, bf16, fp8, scaleup = TABLE[hw_id]
    assert round(hw.memory_bytes / 1e9, 1) == gb
    assert hw.mem_bw == pytest.approx(bw * 1e12)
    assert hw.bf16_flops == pytest.approx(bf16 * 1e12)
    if fp8 is None:
        assert hw.fp8_flops is None and not hw.has_fp8
    else:
        assert hw.fp8_flops == pytest.approx(fp8 * 1e12)
    assert hw.scaleup_bw == pytest.approx(scaleup * 1e9)


def test_h100_sxm_field_by_field() -> None:
    hw = get_hardware("h100-sxm")
    assert hw.memory_bytes == 81559 * 2**20           # nvidia-smi MiB [SMI]
    assert hw.mem_bw == 3.35e12
    assert hw.bf16_flops == pytest.approx(989.4e12)
    assert hw.fp8_flops == pytest.approx(1978.9e12)
    assert hw.scaleup_bw == 450e9 and hw.scaleup_kind == "nvlink4"
    assert (hw.gemm_mfu, hw.fp8_gemm_mfu, hw.weight_bw_frac, hw.attn_bw_frac, hw.prefill_attn_mfu) == \
        (0.79, 0.53, 0.87, 0.87, 0.56)
    assert hw.comm_bw_frac == DEFAULT_COMM_BW_FRAC == 0.7
    assert hw.comm_latency_s == 5e-6
    assert hw.scaleup_link_bw is None


def test_other_devices_field_by_field() -> None:
    mi = get_hardware("mi300x")
    assert mi.memory_bytes == 205_822_885_888         # rocm-smi bytes [ROCM]
    assert mi.scaleup_kind == "infinity-fabric" and mi.scaleup_link_bw == 64e9
    assert "approx" in mi.notes and "defaults" in mi.notes
    assert mi.gemm_mfu == DEFAULT_GEMM_MFU and mi.weight_bw_frac == DEFAULT_WEIGHT_BW_FRAC

    a100 = get_hardware("a100-80gb")
    assert a100.memory_bytes == 81920 * 2**20 and a100.fp8_flops is None
    assert a100.scaleup_kind == "nvlink3" and a100.gemm_mfu == 0.91

    l40s = get_hardware("l40s")
    assert l40s.fp8_flops == pytest.approx(733e12)    # dense, not inference-sim's sparse 1466
    assert l40s.scaleup_kind == "pcie4" and l40s.comm_latency_s == 10e-6

    rtx = get_hardware("rtx-4090")
    assert rtx.bf16_flops == pytest.approx(165.2e12)  # FP32-accumulate, half the FP16-acc 330.3
    assert rtx.fp8_flops == pytest.approx(330.3e12)
    assert "FP32-accumulate" in rtx.notes

    ascend = get_hardware("ascend-910b")
    assert ascend.memory_bytes == 65536 * 2**20 and ascend.fp8_flops is None
    assert ascend.weight_bw_frac == ascend.attn_bw_frac == 0.85   # Ascend aiconfigurator fork
    assert ascend.scaleup_kind == "hccs" and ascend.scaleup_link_bw == 56e9

    gb200 = get_hardware("gb200")
    assert gb200.memory_bytes == 189471 * 2**20 and gb200.scaleup_kind == "nvlink5"


@pytest.mark.parametrize("hw_id", sorted(MEASURED))
def test_measured_efficiencies_are_the_vllm_medians(hw_id: str) -> None:
    hw = HARDWARE[hw_id]
    gemm, fp8, weight, attn, prefill = MEASURED[hw_id]
    assert (hw.gemm_mfu, hw.weight_bw_frac, hw.attn_bw_frac, hw.prefill_attn_mfu) == \
        (gemm, weight, attn, prefill)
    if fp8 is not None:
        assert hw.fp8_gemm_mfu == fp8


def test_unmeasured_devices_borrow_from_the_closest_and_say_so() -> None:
    for copy, origin in (("h100-pcie", "h100-sxm"), ("a100-40gb", "a100-80gb"),
                         ("rtx-4090", "l40s"), ("rtx-6000-ada", "l40s")):
        a, b = HARDWARE[copy], HARDWARE[origin]
        assert (a.gemm_mfu, a.weight_bw_frac, a.attn_bw_frac, a.prefill_attn_mfu) == \
            (b.gemm_mfu, b.weight_bw_frac, b.attn_bw_frac, b.prefill_attn_mfu)
        assert f"copied from {origin}" in a.notes


def test_mesh_fabrics_scale_with_group_size() -> None:
    mi = get_hardware("mi300x")
    assert mi.scaleup_bw_for_group(1) == 0.0
    assert mi.scaleup_bw_for_group(2) == 64e9
    assert mi.scaleup_bw_for_group(8) == 448e9
    h100 = get_hardware("h100-sxm")
    assert h100.scaleup_bw_for_group(2) == h100.scaleup_bw_for_group(8) == 450e9


def test_hardware_is_frozen_and_slotted() -> None:
    hw = get_hardware("h100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.gemm_mfu = 0.5  # type: ignore[misc]
    assert not hasattr(hw, "__dict__")


def test_import_is_stdlib_only() -> None:
    code = "import sys, kvsched.perf; print('yaml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- names --------------------------------------------------------------------

@pytest.mark.parametrize(("name", "hw_id"), [
    ("H100", "h100-sxm"), ("h100", "h100-sxm"), ("H100_SXM", "h100-sxm"), (" h100-pcie ", "h100-pcie"),
    ("a100", "a100-80gb"), ("A100_40GB", "a100-40gb"), ("RTX_4090", "rtx-4090"), ("MI300X", "mi300x"),
    ("Ascend_910B", "ascend-910b"), ("910c", "ascend-910c"), ("GB200", "gb200"),
])
def test_aliases_and_case(name: str, hw_id: str) -> None:
    assert get_hardware(name).id == hw_id


def test_unknown_id_lists_known_ids() -> None:
    message = _raises_naming(lambda: get_hardware("h300"), "'h300'", "h100-sxm", "ascend-910c")
    assert ".yaml" in message


# -- hardware files -------------------------------------------------------------

def test_yaml_hardware_file(tmp_path: Path) -> None:
    path = tmp_path / "dev.yaml"
    # 3.35e12 without a dot is a *string* to PyYAML; the loader must still accept it.
    path.write_text(
        "id: my-gpu\nname: My GPU\nmemory_bytes: 80e9\nmem_bw: 2e12\nbf16_flops: 5.0e+14\n"
        "fp8_flops: null\nscaleup_bw: 300e9\nscaleup_kind: nvlink3\ngemm_mfu: 0.6\n", encoding="utf-8")
    hw = get_hardware(str(path))
    assert hw.memory_bytes == 80_000_000_000 and isinstance(hw.memory_bytes, int)
    assert hw.mem_bw == 2e12 and hw.bf16_flops == 5e14 and hw.fp8_flops is None
    assert hw.gemm_mfu == 0.6
    assert hw.attn_bw_frac == DEFAULT_ATTN_BW_FRAC            # omitted -> default
    assert hw.source == f"file {path}"


def test_json_hardware_file(tmp_path: Path) -> None:
    path = _write_json(tmp_path / "dev.json", _minimal(fp8_flops=1e15, comm_bw_frac=0.5,
                                                        scaleup_link_bw=5e10, notes="mine"))
    hw = load_hardware_file(path)
    assert hw == Hardware(**_minimal(fp8_flops=1e15, comm_bw_frac=0.5, scaleup_link_bw=5e10,  # type: ignore[arg-type]
                                     notes="mine", source=f"file {path}"))
    assert get_hardware(str(path)) == hw


@pytest.mark.parametrize(("data", "needles"), [
    (_minimal(tflops=1), ("unknown field 'tflops'", "allowed fields")),
    ({k: v for k, v in _minimal().items() if k != "mem_bw"}, ("missing required field 'mem_bw'",)),
    ({k: v for k, v in _minimal().items() if k != "fp8_flops"}, ("missing required field 'fp8_flops'",)),
    (_minimal(mem_bw=-1), ("mem_bw=-1", "positive")),
    (_minimal(memory_bytes=85.5), ("memory_bytes=85.5", "bytes")),
    (_minimal(gemm_mfu=1.3), ("gemm_mfu=1.3", "(0, 1]")),
    (_minimal(comm_latency_s=-1e-6), ("comm_latency_s",)),
    (_minimal(bf16_flops=True), ("bf16_flops=True",)),
    (_minimal(bf16_flops="lots"), ("bf16_flops='lots'", "number")),
    (_minimal(id="My GPU"), ("id=", "lower-case")),
    (_minimal(scaleup_link_bw=1e12), ("scaleup_link_bw", "cannot exceed scaleup_bw")),
    ([1, 2], ("top level must be a mapping",)),
])
def test_bad_hardware_files_name_the_file_and_field(tmp_path: Path, data: object,
                                                    needles: tuple[str, ...]) -> None:
    path = _write_json(tmp_path / "bad.json", data)
    _raises_naming(lambda: load_hardware_file(path), str(path), *needles)


def test_unreadable_hardware_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    _raises_naming(lambda: get_hardware(str(missing)), str(missing), "no such file")
    broken = tmp_path / "broken.yaml"
    broken.write_text("id: [unclosed\n", encoding="utf-8")
    _raises_naming(lambda: load_hardware_file(broken), str(broken), "not valid YAML")
    broken_json = tmp_path / "broken.json"
    broken_json.write_text("{", encoding="utf-8")
    _raises_naming(lambda: load_hardware_file(broken_json), "not valid JSON")


# -- overrides ------------------------------------------------------------------

def test_with_overrides() -> None:
    hw = get_hardware("h100-sxm")
    tuned = with_overrides(hw, gemm_mfu=0.7, comm_latency_s=8e-6)
    assert (tuned.gemm_mfu, tuned.comm_latency_s) == (0.7, 8e-6)
    assert tuned.mem_bw == hw.mem_bw and hw.gemm_mfu == 0.79      # original untouched
    _raises_naming(lambda: with_overrides(hw, gemm_mfuu=0.7), "unknown field 'gemm_mfuu'", "gemm_mfu")
    _raises_naming(lambda: with_overrides(hw, weight_bw_frac=0.0), "weight_bw_frac=0.0")


def test_override_file_global_then_per_device(tmp_path: Path) -> None:
    path = tmp_path / "eff.yaml"
    path.write_text(
        "comm_bw_frac: 0.6\ngemm_mfu: 0.7\n"
        "H100_SXM:\n  gemm_mfu: 0.72\n"          # alias/case of the device -> applies, after globals
        "b200:\n  gemm_mfu: 0.5\n", encoding="utf-8")
    h100 = load_efficiency_overrides(path, get_hardware("h100-sxm"))
    assert (h100.comm_bw_frac, h100.gemm_mfu) == (0.6, 0.72)
    assert h100.weight_bw_frac == 0.87                            # untouched
    a100 = load_efficiency_overrides(path, get_hardware("a100"))
    assert (a100.comm_bw_frac, a100.gemm_mfu) == (0.6, 0.7)      # b200/h100 sections ignored


def test_override_file_for_a_custom_device(tmp_path: Path) -> None:
    custom = Hardware(**_minimal())  # type: ignore[arg-type]
    path = _write_json(tmp_path / "eff.json", {"my-gpu": {"attn_bw_frac": 0.5}})
    assert load_efficiency_overrides(path, custom).attn_bw_frac == 0.5


@pytest.mark.parametrize(("data", "needles"), [
    ({"gemm_mfuu": 0.5}, ("'gemm_mfuu'", "efficiency field")),
    ({"h300": {"gemm_mfu": 0.5}}, ("unknown hardware id 'h300'", "h100-sxm")),
    ({"h100-sxm": {"mem_bw": 1e12}}, ("h100-sxm.mem_bw", "not an efficiency field", "hardware file")),
    ({"gemm_mfu": 2}, ("gemm_mfu=2",)),
    ({"mem_bw": 1e12}, ("mem_bw: not an efficiency field", "hardware file")),
])
def test_bad_override_files(tmp_path: Path, data: object, needles: tuple[str, ...]) -> None:
    path = _write_json(tmp_path / "eff.json", data)
    _raises_naming(lambda: load_efficiency_overrides(path, get_hardware("h100-sxm")), str(path), *needles)


def test_efficiency_fields_are_hardware_fields() -> None:
    names = {f.name for f in dataclasses.fields(Hardware)}
    assert set(EFFICIENCY_FIELDS) <= names


def test_docs_examples_load(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "catalogs.md").read_text(encoding="utf-8")
    device_yaml, override_yaml = (block.split("```")[0] for block in doc.split("```yaml\n")[1:3])
    (tmp_path / "dev.yaml").write_text(device_yaml, encoding="utf-8")
    (tmp_path / "eff.yaml").write_text(override_yaml, encoding="utf-8")
    hw = get_hardware(str(tmp_path / "dev.yaml"))
    assert (hw.id, hw.memory_bytes, hw.fp8_flops) == ("a100-40gb-pcie", 40960 * 2**20, None)
    assert hw.gemm_mfu == 0.91
    tuned = load_efficiency_overrides(tmp_path / "eff.yaml", get_hardware("h100-sxm"))
    assert (tuned.comm_bw_frac, tuned.gemm_mfu) == (0.6, 0.72)


def test_fp4_flops_is_optional_in_hardware_files(tmp_path: Path) -> None:
    path = _write_json(tmp_path / "dev.json", _minimal())
    assert load_hardware_file(path).fp4_flops is None
    path = _write_json(tmp_path / "fp4.json", _minimal(fp8_flops=1e15, fp4_flops=2e15))
    assert load_hardware_file(path).fp4_flops == 2e15
    with pytest.raises(ValueError, match="fp4_flops=-1"):
        load_hardware_file(_write_json(tmp_path / "bad.json", _minimal(fp4_flops=-1)))


# -- tensor parallelism past the scale-up domain --------------------------------


@pytest.mark.parametrize(("hw_id", "domain"), [
    ("h100-sxm", 8), ("h200", 8), ("b200", 8), ("a100-80gb", 8), ("l40s", 8), ("mi300x", 8),
    ("gb200", 72), ("ascend-910c", 384)])
def test_scale_up_domains(hw_id: str, domain: int) -> None:
    hw = get_hardware(hw_id)
    assert hw.scaleup_domain == domain
    assert hw.tensor_parallel_bw(domain) == hw.scaleup_bw_for_group(domain)


def test_tp_past_the_nvlink_domain_is_refused_without_a_scale_out_figure() -> None:
    from kvsched.sim.deployment import EngineOptions, build_deployment

    a100 = get_hardware("a100-80gb")
    assert a100.tensor_parallel_bw(8) == 300e9
    with pytest.raises(ValueError, match=r"tensor_parallel_size=16 \(--tensor-parallel-size\): NVIDIA "
                                         r"A100 SXM 80GB's nvlink3 joins 8 devices.*use at most 8"):
        a100.tensor_parallel_bw(16)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=64 .*joins 8 devices"):
        build_deployment(EngineOptions(model="Llama-3.1-405B", hardware="a100-80gb", tensor_parallel_size=64))
    # H100, H200, B200: a DGX node's NIC per GPU (400 Gb/s ConnectX-7, docs/catalogs.md [DGX-RA]).
    for gpu in ("h100-sxm", "h200", "b200"):
        assert get_hardware(gpu).tensor_parallel_bw(16) == 50e9
    # GB200 NVL72: TP16 is within its NVLink domain.
    d = build_deployment(EngineOptions(model="Llama-3.1-70B", hardware="gb200", tensor_parallel_size=16,
                                       step_time_backend="roofline"))
    assert d.step_model.ar_bw == 900e9 * d.hardware.comm_bw_frac


def test_tp_past_the_domain_runs_on_the_scale_out_network(tmp_path: Path) -> None:
    from kvsched.perf.step_time import BatchShape, ParallelConfig, StepTimeModel

    # Two 8-GPU H100 nodes joined by 200 Gb/s InfiniBand per GPU (25 GB/s per
    # direction; the catalog's H100 has 400 Gb/s, so neither variant below is the
    # catalog entry and both are priced with the hardware's own factors).
    ib = with_overrides(get_hardware("h100-sxm"), scaleout_bw=25e9)
    assert ib.tensor_parallel_bw(8) == 450e9
    assert ib.tensor_parallel_bw(16) == 25e9
    llama = get_model("Llama-3.1-405B")
    sm = StepTimeModel(llama, ib, ParallelConfig(16))
    assert sm.ar_bw == 25e9 * ib.comm_bw_frac
    # A 4096-token prefill: two all-reduces per layer of 4096 x 16384 16-bit
    # values, 2 (n - 1) / n of them sent per GPU at the InfiniBand rate.
    shape = BatchShape(4096, 1, 1, 0, 0, 4096, 4096, 4096 * 4097 // 2)
    nvlink = StepTimeModel(llama, dataclasses.replace(ib, scaleup_domain=16), ParallelConfig(16))
    message = 4096 * 16384 * 2
    extra = 2 * 126 * 2 * 15 / 16 * message * (1 / (25e9 * ib.comm_bw_frac) - 1 / (450e9 * ib.comm_bw_frac))
    assert sm.gpu_time(shape) - nvlink.gpu_time(shape) == pytest.approx(extra, rel=1e-9)
    path = tmp_path / "h100-ib.json"
    fields = {f: getattr(ib, f) for f in ("id", "name", "memory_bytes", "mem_bw", "bf16_flops", "fp8_flops",
                                          "scaleup_bw", "scaleup_kind", "scaleout_bw")}
    path.write_text(json.dumps({**fields, "id": "h100-ib"}))
    assert load_hardware_file(path).tensor_parallel_bw(16) == 25e9


@pytest.mark.parametrize("value", [0, 2**17, 8.0, True])
def test_scaleup_domain_is_checked(value: object) -> None:
    with pytest.raises(ValueError, match="scaleup_domain"):
        with_overrides(get_hardware("h100-sxm"), scaleup_domain=value)


def test_cuda_capability_is_read_from_the_catalog_names() -> None:
    # DeviceCapability.major of each catalog GPU (NVIDIA's CUDA GPUs table): what vLLM's
    # attention backend choices read; None off CUDA.
    expected = {"h100-sxm": 9, "h100-pcie": 9, "h200": 9, "h20": 9, "a100-80gb": 8, "a100-40gb": 8,
                "a10g": 8, "l4": 8, "l40s": 8, "rtx-4090": 8, "rtx-6000-ada": 8, "rtx-pro-6000": 12,
                "b200": 10, "gb200": 10, "b300": 10, "gb300": 10, "mi300x": None, "ascend-910b": None}
    assert {name: get_hardware(name).cuda_capability_major for name in expected} == expected
    sm100 = [name for name in expected if get_hardware(name).sm100_family]
    assert sm100 == ["b200", "gb200", "b300", "gb300"]
