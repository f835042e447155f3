"""What the agents ask and how their replies are read."""

from __future__ import annotations

from pike.agents import (
    AgentContext,
    brainstorm_messages,
    extract_ideas,
    extract_module,
    fix_messages,
    optimize_messages,
)
from pike.evaluate.verdict import OutputMismatch, TimingStats, Verdict

TASK = "class Model:\n    pass\n"
FULL = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


def test_the_last_block_defining_modelnew_wins() -> None:
    reply = (f"First a snippet:\n```python\ny = x * 2\n```\nThen the module:\n```python\n{FULL}```"
             "\nAnd a shell line:\n```bash\npip install x\n```\n")
    assert extract_module(reply) == FULL


def test_replies_without_usable_code_give_none() -> None:
    assert extract_module("I would fuse the kernels.") is None
    assert extract_module("```python\nprint('no model here')\n```") is None


def test_a_bare_module_without_fences_is_accepted() -> None:
    assert extract_module(FULL) == FULL


def test_ideas_are_read_from_numbered_or_bulleted_lists() -> None:
    reply = "Ideas:\n1. Fuse **GELU**\n   into the matmul epilogue.\n2) Use SDPA.\n- CUDA graphs\n"
    assert extract_ideas(reply, 10) == ["Fuse GELU into the matmul epilogue.", "Use SDPA.",
                                        "CUDA graphs"]
    assert extract_ideas(reply, 2) == ["Fuse GELU into the matmul epilogue.", "Use SDPA."]


def test_the_backend_and_the_device_change_the_instructions() -> None:
    device = "NVIDIA H100 80GB HBM3 (compute capability 9.0, 79 GiB)"
    systems = {b: brainstorm_messages(AgentContext(TASK, b, device), 5)[0]["content"]
               for b in ("any", "cuda", "triton")}
    assert "load_inline" in systems["cuda"] and "Triton" not in systems["cuda"]
    assert "triton.language" in systems["triton"]
    assert all(device in s for s in systems.values())
    assert len(set(systems.values())) == 3


def test_the_optimizer_sees_its_parent_and_its_idea() -> None:
    ctx = AgentContext(TASK, "any", "CPU")
    parent = Verdict(status="ok", runtime=TimingStats.from_samples([2.0]), speedup=1.5)
    text = optimize_messages(ctx, FULL, parent, "fuse the GELU")[1]["content"]
    assert FULL.strip() in text and "2 ms" in text and "1.50x" in text
    assert "Apply this idea: fuse the GELU" in text
    assert "Make it faster" in optimize_messages(ctx, None, None, None)[1]["content"]


def test_the_fixer_gets_the_failing_source_and_the_trimmed_report() -> None:
    ctx = AgentContext(TASK, "any", "CPU")
    verdict = Verdict(status="incorrect", message="1 of 5 trials failed",
                      mismatches=[OutputMismatch(trial=0, output=0, problem="values differ",
                                                 expected_shape=[4], actual_shape=[4])])
    text = fix_messages(ctx, FULL, verdict)[1]["content"]
    assert "`incorrect`" in text and "values differ" in text and FULL.strip() in text
