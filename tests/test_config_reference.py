"""The configuration reference in the docs is generated from RunConfig and kept current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from pike.config import RunConfig
from pike.config_reference import main, render, sections, type_name
from tests.conftest import ROOT

COMMITTED = ROOT / "docs" / "reference" / "config.md"


def test_the_committed_reference_is_current() -> None:
    assert COMMITTED.read_text() == render(), (
        "docs/reference/config.md is stale: run python -m pike.config_reference")


def test_every_key_of_every_section_is_documented() -> None:
    text = render()
    for path, model in sections():
        assert f"## `{path}`" in text or not path
        for name in model.model_fields:
            assert f"| `{name}` |" in text, f"{path}.{name}"


def test_the_yaml_of_defaults_loads_as_the_default_config(tmp_path: Path) -> None:
    block = render().split("```yaml\n")[1].split("```")[0]
    path = tmp_path / "run.yaml"
    path.write_text(block)
    assert RunConfig.load(path) == RunConfig()
    assert yaml.safe_load(block)["eval"]["trials"] == 5


def test_check_fails_on_a_stale_file_and_passes_on_a_fresh_one(tmp_path: Path) -> None:
    out = tmp_path / "config.md"
    out.write_text("# an old reference\n")
    assert main(["--out", str(out), "--check"]) == 1
    assert main(["--out", str(out)]) == 0
    assert main(["--out", str(out), "--check"]) == 0
    assert out.read_text() == render()


def test_it_runs_as_a_module(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pike.config_reference", "--check", "--out",
                           str(tmp_path / "missing.md")], capture_output=True, text=True)
    assert done.returncode == 1 and "is stale" in done.stderr


def test_types_read_as_values_a_user_writes() -> None:
    fields = RunConfig.model_fields["eval"].annotation.model_fields  # type: ignore[union-attr]
    assert type_name(fields["sandbox"].annotation) == "`auto`, `required`, `off`"
    assert type_name(fields["device"].annotation) == "str or null"
    assert type_name(fields["devices"].annotation) == "list of str"
    assert type_name(fields["build_cache"].annotation) == "path or null"
