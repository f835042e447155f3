"""The floor: FLOPs and bytes of a reference, device peaks, and the lower bound they give."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from pike.errors import ConfigError, TaskError
from pike.floor import (
    Device,
    Work,
    count_work,
    describe,
    floor,
    load_devices,
    match_device,
    no_floor_reason,
    times_floor,
)
from pike.task import Task
from tests.conftest import BUILT_UNDER_A_DEVICE, EXAMPLES

ROOT = Path(__file__).resolve().parent.parent
DEVICES_YAML = ROOT / "src" / "pike" / "data" / "devices.yaml"


def make_task(tmp_path: Path, body: str, name: str = "1_Tiny") -> Task:
    path = tmp_path / f"{name}.py"
    path.write_text("import math\nimport torch\nimport torch.nn as nn\n\n" + textwrap.dedent(body))
    return Task.from_file(path)


# ---------------------------------------------------------------- FLOPs

def test_linear_flops_are_2mnk(tmp_path: Path) -> None:
    m, k, n = 16, 64, 32
    task = make_task(tmp_path, f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear({k}, {n})
            def forward(self, x):
                return self.fc(x)
        def get_inputs():
            return [torch.randn({m}, {k})]
        def get_init_inputs():
            return []
    """)
    work = count_work(task)
    assert work.flops == 2 * m * n * k
    assert work.flops_by_op == {"aten.addmm": 2 * m * n * k}


def test_conv2d_flops(tmp_path: Path) -> None:
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
            def forward(self, x):
                return self.conv(x)
        def get_inputs():
            return [torch.randn(2, 3, 16, 16)]
        def get_init_inputs():
            return []
    """)
    # 2 FLOPs per multiply-add: every output element (2*8*16*16) sums Cin*kh*kw = 3*3*3 products
    assert count_work(task).flops == 2 * (2 * 8 * 16 * 16) * (3 * 3 * 3)


def test_attention_flops_count_both_matmuls_and_not_softmax(tmp_path: Path) -> None:
    b, h, t, d = 2, 4, 32, 16
    task = make_task(tmp_path, f"""
        class Model(nn.Module):
            def forward(self, q, k, v):
                scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
                return torch.softmax(scores, dim=-1) @ v
        def get_inputs():
            return [torch.randn({b}, {h}, {t}, {d}) for _ in range(3)]
        def get_init_inputs():
            return []
    """)
    work = count_work(task)
    assert work.flops == 2 * (2 * b * h * t * t * d)  # QK^T and PV, each 2*T*T*D per head
    assert any("_softmax" in note and "lower bound" in note for note in work.notes)


def test_meta_device_counts_the_same_as_cpu_and_rng_is_left_alone() -> None:
    task = Task.from_file(ROOT / "examples" / "tasks" / "3_CausalAttention.py")
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    on_cpu = count_work(task, "cpu")
    assert torch.equal(torch.rand(1), expected)
    on_meta = count_work(task, "meta")
    assert on_meta.model_dump(exclude={"counted_on"}) == on_cpu.model_dump(exclude={"counted_on"})
    assert any("causal" in note for note in on_cpu.notes)


def test_a_failing_task_is_a_task_error_naming_the_file(tmp_path: Path) -> None:
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def forward(self, x):
                raise ValueError("boom")
        def get_inputs():
            return [torch.randn(2)]
        def get_init_inputs():
            return []
    """, name="7_Broken")
    with pytest.raises(TaskError, match=r"7_Broken.py: .*forward.*ValueError: boom"):
        count_work(task)


# ---------------------------------------------------------------- bytes

def test_bytes_min_is_inputs_params_buffers_outputs_each_once(tmp_path: Path) -> None:
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)
                self.register_buffer("scale", torch.ones(3))
            def forward(self, x, idx):
                return self.fc(x) * self.scale, x   # x comes back as is: moved once
        def get_inputs():
            return [torch.randn(2, 4), torch.arange(5)]
        def get_init_inputs():
            return []
    """)
    work = count_work(task)
    inputs = 2 * 4 * 4             # fp32 x; idx is never read, so it need not move
    params = (3 * 4 + 3) * 4       # weight and bias, fp32
    buffers = 3 * 4
    outputs = 2 * 3 * 4            # the returned x is the input, not counted again
    assert (work.bytes_inputs, work.bytes_params, work.bytes_buffers, work.bytes_outputs) == (
        inputs, params, buffers, outputs)
    assert work.bytes_min == inputs + params + buffers + outputs == 128
    assert work.dtype == "fp32"


def test_bytes_min_counts_only_the_slice_of_a_cache_the_forward_reads(tmp_path: Path) -> None:
    # a decode step: the cache holds 64 positions, the forward reads the first 8 of them;
    # counting all of it put eager below the floor on level5's MLA decode task (H100)
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("cache", torch.randn(64, 16))
                self.unused = nn.Linear(100, 100)
            def forward(self, q):
                return q @ self.cache[:8].t()
        def get_inputs():
            return [torch.randn(1, 16)]
        def get_init_inputs():
            return []
    """)
    for device in ("cpu", "meta"):
        work = count_work(task, device)
        assert work.bytes_buffers == 8 * 16 * 4
        assert work.bytes_params == 0  # the unused layer moves nothing
        assert work.bytes_min == 16 * 4 + 8 * 16 * 4 + 8 * 4
        assert any("only what it reads is counted" in n for n in work.notes)


def test_bytes_min_is_the_union_of_the_views_read(tmp_path: Path) -> None:
    # rows read in chunks, columns read in chunks, one slice read twice, a table looked up
    # by two indices, and a template that only lends its shape
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("rows", torch.randn(8, 16))
                self.register_buffer("cols", torch.randn(16, 8))
                self.register_buffer("twice", torch.randn(64, 16))
                self.table = nn.Embedding(1000, 16)
                self.register_buffer("template", torch.randn(128, 128))
            def forward(self, q, ids):
                out = sum(q @ c.t() for c in self.rows.chunk(4, dim=0)).sum()
                out = out + sum(c.sum() for c in self.cols.chunk(4, dim=1))
                out = out + (q @ self.twice[:8].t()).sum() + (q @ self.twice[:8].t()).sum()
                out = out + self.table(ids).sum()
                return out + torch.zeros_like(self.template).sum()
        def get_inputs():
            return [torch.randn(1, 16), torch.tensor([3, 7])]
        def get_init_inputs():
            return []
    """)
    for device in ("cpu", "meta"):
        work = count_work(task, device)
        rows, cols, twice = 8 * 16 * 4, 16 * 8 * 4, 8 * 16 * 4
        assert work.bytes_buffers == rows + cols + twice  # the template's data is never read
        assert work.bytes_params == 2 * 16 * 4  # the two rows looked up, not the table


def test_an_index_op_caps_its_table_not_its_indices(tmp_path: Path) -> None:
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def forward(self, x, idx, y):
                y.unsqueeze_(0)  # changes y's shape only: reads none of it
                return torch.gather(x, 1, idx)
        def get_inputs():
            return [torch.randn(64, 64).half(), torch.zeros(64, 4, dtype=torch.long),
                    torch.randn(1000)]
        def get_init_inputs():
            return []
    """)
    work = count_work(task, "meta")
    gathered = 64 * 4 * 2  # fp16 values read of the table, at most what comes back
    assert work.bytes_inputs == gathered + 64 * 4 * 8  # and every int64 index


def test_dtype_class_is_the_dominant_floating_dtype(tmp_path: Path) -> None:
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8).to(torch.bfloat16)
            def forward(self, x):
                return self.fc(x)
        def get_inputs():
            return [torch.randn(4, 8, dtype=torch.bfloat16)]
        def get_init_inputs():
            return []
    """)
    work = count_work(task)
    assert work.dtype == "bf16"
    assert work.bytes_min == (4 * 8 + 8 * 8 + 8 + 4 * 8) * 2


def test_build_on_device_counts_a_task_written_to_be_built_on_its_device(
        tmp_path: Path) -> None:
    path = tmp_path / "1_BuiltOnDevice.py"
    path.write_text(BUILT_UNDER_A_DEVICE)
    task = Task.from_file(path)
    assert count_work(task, "cpu", build_on_device=True).flops == 2 * 4 * 8 * 8
    with pytest.raises(TaskError, match="not built under torch.device"):
        count_work(task, "cpu")


# ---------------------------------------------------------------- devices


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_task_setting_torch_defaults_leaves_them_to_the_next_count(
        tmp_path: Path, device: str) -> None:
    sets_bf16 = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                torch.set_default_dtype(torch.bfloat16)  # as level5's 4_llama2 does
                torch.set_default_device("DEVICE")  # as level5's __main__ blocks do
                self.fc = nn.Linear(8, 8)
            def forward(self, x):
                return self.fc(x.to(self.fc.weight.dtype))
        def get_inputs():
            return [torch.randn(4, 8)]
        def get_init_inputs():
            return []
    """.replace("DEVICE", device), name="1_SetsDefaults")
    plain = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
            def forward(self, x):
                return self.fc(x)
        def get_inputs():
            return [torch.randn(4, 8)]
        def get_init_inputs():
            return []
    """, name="2_Plain")
    assert count_work(sets_bf16, device).dtype == "bf16"
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_default_device() == torch.device("cpu")
    work = count_work(plain, device)
    assert work.dtype == "fp32" and work.bytes_min == (4 * 8 + 8 * 8 + 8 + 4 * 8) * 4

@pytest.mark.parametrize(("device_name", "entry"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("nvidia h100 80gb hbm3", "H100 SXM"),
])
def test_device_names_match_their_entry(device_name: str, entry: str) -> None:
    device = match_device(device_name)
    assert device is not None and device.name == entry


@pytest.mark.parametrize("device_name", ["NVIDIA H100 NVL", "NVIDIA H200 NVL", "Tesla T4", "H100"])
def test_unknown_devices_have_no_floor(device_name: str) -> None:
    work = Work(flops=10, bytes_min=10)
    assert match_device(device_name) is None
    assert floor(work, device_name) is None
    assert "no peaks on file" in (no_floor_reason(work, device_name) or "")


@pytest.mark.parametrize("device_name", ["cpu", "x86_64", "aarch64"])
def test_cpu_has_no_floor(device_name: str) -> None:
    work = Work(flops=10, bytes_min=10)
    assert floor(work, device_name) is None
    assert "CPU" in (no_floor_reason(work, device_name) or "")
    assert describe(None) == "no floor for this device"


def test_device_file_has_every_field_for_every_entry() -> None:
    raw = yaml.safe_load(DEVICES_YAML.read_text())["devices"]
    fields = set(Device.model_fields)
    for entry in raw:
        assert set(entry) == fields, entry.get("name")
        for precision in ("bf16", "fp16", "tf32", "fp32", "bandwidth"):
            assert isinstance(entry[precision], float), (entry["name"], precision)
        # dense tensor-core peaks are at least the CUDA-core fp32 peak; HBM/GDDR is 0.1-10 TB/s
        assert entry["bf16"] >= entry["tf32"] >= entry["fp32"] > 1e12, entry["name"]
        assert 1e11 < entry["bandwidth"] < 1e13, entry["name"]
    names = {d.name for d in load_devices()}
    assert {"H100 SXM", "H100 PCIe", "H200", "A100 SXM 80GB", "L40S", "B200", "RTX 4090"} <= names
    assert any(n.startswith("A100 PCIe") for n in names)


def test_a_device_file_missing_a_field_is_a_config_error(tmp_path: Path) -> None:
    entry = yaml.safe_load(DEVICES_YAML.read_text())["devices"][0]
    del entry["tf32"]
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump({"devices": [entry]}))
    with pytest.raises(ConfigError, match="tf32"):
        load_devices(path)


# ---------------------------------------------------------------- the floor

H100 = "NVIDIA H100 80GB HBM3"  # datasheet: fp32 67 TF/s, bf16 989.4 TF/s dense, 3.35 TB/s


def test_memory_bound_floor() -> None:
    work = Work(flops=1_000_000, bytes_min=48_000_000, dtype="fp32")
    fl = floor(work, H100)
    assert fl is not None and fl.device == "H100 SXM"
    assert fl.memory_ms == pytest.approx(48e6 / 3.35e12 * 1e3)
    assert fl.compute_ms == pytest.approx(1e6 / 67e12 * 1e3)
    assert (fl.ms, fl.bound) == (fl.memory_ms, "memory")
    assert (fl.lowp_ms, fl.lowp_bound) == (fl.memory_ms, "memory")
    assert times_floor(25 * fl.ms, fl) == pytest.approx(25)
    line = describe(fl, runtime_ms=25 * fl.ms)
    assert "memory-bound" in line and "48 MB at 3.35 TB/s" in line and "eager is 25x" in line


def test_compute_bound_fp32_floor_and_its_tensor_core_floor() -> None:
    n = 4096
    work = Work(flops=2 * n**3, bytes_min=3 * n * n * 4, dtype="fp32")
    fl = floor(work, H100)
    assert fl is not None
    assert (fl.bound, fl.precision, fl.peak_flops) == ("compute", "fp32", 67e12)
    assert fl.ms == pytest.approx(2 * n**3 / 67e12 * 1e3)          # 2.05 ms
    assert (fl.lowp_bound, fl.lowp_precision) == ("compute", "bf16")
    assert fl.lowp_ms == pytest.approx(2 * n**3 / 989.4e12 * 1e3)  # 0.139 ms
    assert times_floor(2 * fl.lowp_ms, fl, lowp=True) == pytest.approx(2)
    line = describe(fl)
    assert "compute-bound" in line and "fp32" in line and "bf16 tensor cores" in line


def test_an_fp32_tasks_convolutions_count_at_the_tf32_peak_and_the_rest_at_fp32() -> None:
    """cuDNN runs fp32 convolutions in TF32 by default, the reference's too: on an H200
    compile default ran 6_GoogleNetInceptionModule below a floor that counted them at the
    CUDA-core fp32 peak. Its matrix multiplies stay at fp32 (torch's default there)."""
    conv, gemm = 4 * 10**12, 10**12
    work = Work(flops=conv + gemm, flops_by_op={"aten.convolution": conv, "aten.addmm": gemm},
                bytes_min=10, dtype="fp32")
    fl = floor(work, H100)
    assert fl is not None and fl.precision == "fp32" and fl.tf32_flops == conv
    assert fl.compute_ms == pytest.approx((conv / 494.7e12 + gemm / 67e12) * 1e3)
    assert fl.peak_flops == pytest.approx((conv + gemm) / fl.compute_ms * 1e3)
    assert fl.ms < (conv + gemm) / 67e12 * 1e3  # below the all-fp32 floor it was
    assert "convolutions in TF32" in describe(fl) and any("TF32" in n for n in fl.notes)
    # a GEMM task, and a half-precision task's convolutions, are as they were
    gemm_only = floor(Work(flops=gemm, flops_by_op={"aten.mm": gemm}, bytes_min=10), H100)
    assert gemm_only is not None and gemm_only.tf32_flops == 0
    assert gemm_only.compute_ms == pytest.approx(gemm / 67e12 * 1e3)
    half = floor(Work(flops=conv, flops_by_op={"aten.convolution": conv}, bytes_min=10,
                      dtype="bf16"), H100)
    assert half is not None and half.tf32_flops == 0 and half.ms == half.lowp_ms
    double = floor(Work(flops=conv, flops_by_op={"aten.convolution": conv}, bytes_min=10,
                        dtype="fp64"), H100)  # cuDNN's TF32 is fp32's, not fp64's
    assert double is not None and double.tf32_flops == 0
    assert not any("TF32" in n for n in double.notes)


def test_half_precision_tasks_use_their_own_peak() -> None:
    fl = floor(Work(flops=10**12, bytes_min=10, dtype="bf16"), "NVIDIA H200")
    assert fl is not None
    assert (fl.precision, fl.lowp_precision, fl.ms) == ("bf16", "bf16", fl.lowp_ms)
    assert fl.ms == pytest.approx(1e12 / 989.4e12 * 1e3)
    assert "tensor cores" not in describe(fl)


def test_a_task_with_no_work_is_infinitely_above_its_floor() -> None:
    fl = floor(Work(flops=0, bytes_min=0), H100)
    assert fl is not None and fl.ms == 0
    assert math.isinf(times_floor(1.0, fl))


@pytest.mark.gpu
def test_on_the_gpu_the_device_matches_and_counts_agree() -> None:
    name = torch.cuda.get_device_name()
    assert match_device(name) is not None, f"{name!r} is not in devices.yaml"
    task = Task.from_file(ROOT / "examples" / "tasks" / "3_CausalAttention.py")
    on_gpu, on_cpu = count_work(task, "cuda"), count_work(task, "cpu")
    assert (on_gpu.flops, on_gpu.bytes_min) == (on_cpu.flops, on_cpu.bytes_min)
    fl = floor(on_gpu, name)
    assert fl is not None and fl.ms > 0


# ---------------------------------------------------------------- wired into the evaluator


def test_baselines_carry_the_work_counted_in_the_reference_child(
        tmp_path: Path, build_cache: Path) -> None:
    from pike.config import EvalConfig, TimingConfig
    from pike.evaluate import measure_baselines

    mlp = Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py")
    cfg = EvalConfig(device="cpu", trials=2, build_cache=build_cache,
                     timing=TimingConfig(min_calls=3, min_seconds=0.01, rounds=2,
                                         warmup_seconds=0.0))
    base = measure_baselines(mlp, cfg, ["eager"])
    assert base.work is not None and base.work.flops == count_work(mlp, "meta").flops > 0
    assert base.floor is None and base.no_floor  # a CPU has no entry: said, not guessed


def test_a_verdict_on_a_known_gpu_reports_its_time_as_a_multiple_of_the_floor() -> None:
    from pike.evaluate.candidate_verdict import attach_floor
    from pike.evaluate.verdict import TimingStats, Verdict

    mlp = Task.from_file(EXAMPLES / "tasks" / "1_GeluMLP.py")
    work = count_work(mlp, "meta")
    verdict = Verdict(status="ok", runtime=TimingStats.from_samples([0.5]),
                      device_name="NVIDIA H100 80GB HBM3")
    attach_floor(verdict, work)
    expected = floor(work, "NVIDIA H100 80GB HBM3")
    assert expected is not None and verdict.floor_ms == expected.ms
    assert verdict.times_floor == pytest.approx(0.5 / expected.ms)
    unknown = Verdict(status="ok", runtime=TimingStats.from_samples([0.5]),
                      device_name="Some Future GPU")
    attach_floor(unknown, work)
    assert unknown.floor_ms is None and unknown.times_floor is None


@pytest.mark.gpu
def test_cuda_verdicts_carry_their_multiple_of_the_floor(mlp_task: Task,
                                                         fast_config: Any) -> None:
    from pike.evaluate import evaluate
    from tests.conftest import candidate

    fast_config.device = "cuda"
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.ok and verdict.floor_ms is not None
    assert verdict.times_floor is not None and verdict.times_floor >= 1.0


def test_a_forward_with_sparse_intermediates_is_counted(tmp_path: Path) -> None:
    task = make_task(tmp_path, """
        class Model(nn.Module):
            def forward(self, x):
                return torch.sparse.mm(x.to_sparse(), x.t())
        def get_inputs():
            return [torch.randn(8, 8)]
        def get_init_inputs():
            return []
    """)
    work = count_work(task)
    assert work.bytes_inputs == 8 * 8 * 4 and work.bytes_outputs == 8 * 8 * 4


def test_io_bytes_are_every_input_and_output_leaf_in_full(tmp_path: Path) -> None:
    """What the evaluator writes of a trial (bench/staging_bytes.py): unlike bytes_min, an
    input the forward reads a slice of counts in full, and the task's default dtype is
    given back to the next task counted."""
    from pike.work_count import io_bytes

    task = make_task(tmp_path, """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                torch.set_default_dtype(torch.float64)
            def forward(self, x, y):
                return x[:2] * 2, y.sum()
        def get_inputs():
            return [torch.randn(10, 4, dtype=torch.float32), torch.randn(3, dtype=torch.float32)]
        def get_init_inputs():
            return []
    """)
    assert io_bytes(task) == (10 * 4 * 4 + 3 * 4, 2 * 4 * 4 + 4)
    assert torch.get_default_dtype() == torch.float32
