"""The reference pages of the docs (configuration, commands) are generated from the code and
kept current: a stale committed page fails here and in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from typer.main import get_command

from pike.cli import app
from pike.config import RunConfig
from pike.reference_docs import commands_page, config_page, main, pages, sections, type_name
from tests.conftest import ROOT

COMMITTED = ROOT / "docs" / "reference"


def test_the_committed_pages_are_current() -> None:
    for name, text in pages().items():
        assert (COMMITTED / name).read_text() == text, (
            f"docs/reference/{name} is stale: run python -m pike.reference_docs")


def test_every_key_of_every_section_is_documented() -> None:
    text = config_page()
    for path, model in sections():
        assert f"## `{path}`" in text or not path
        for name in model.model_fields:
            assert f"| `{name}` |" in text, f"{path}.{name}"


def test_the_yaml_of_defaults_loads_as_the_default_config(tmp_path: Path) -> None:
    block = config_page().split("```yaml\n")[1].split("```")[0]
    path = tmp_path / "run.yaml"
    path.write_text(block)
    assert RunConfig.load(path) == RunConfig()
    assert yaml.safe_load(block)["eval"]["trials"] == 5


def test_every_command_and_option_is_documented() -> None:
    text = commands_page()
    group = get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        section = text.split(f"## `pike {name}`")[1].split("\n## ")[0]
        for param in command.params:
            if param.param_type_name == "option":
                assert f"| `{param.opts[0]}`" in section, (name, param.opts)
    assert "`pike audit [OPTIONS] [SOLUTIONS] [TASKS]`" in text
    assert "<task>" not in text  # an HTML tag to Markdown: it would vanish from the page


def test_check_fails_on_a_stale_page_and_passes_on_fresh_ones(tmp_path: Path) -> None:
    (tmp_path / "config.md").write_text("# an old reference\n")
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--out", str(tmp_path), "--check"]) == 0
    assert (tmp_path / "commands.md").read_text() == commands_page()


def test_it_runs_as_a_module(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pike.reference_docs", "--check", "--out",
                           str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 1 and "config.md is stale" in done.stderr


def test_types_read_as_values_a_user_writes() -> None:
    fields = RunConfig.model_fields["eval"].annotation.model_fields  # type: ignore[union-attr]
    assert type_name(fields["sandbox"].annotation) == "`auto`, `required`, `off`"
    assert type_name(fields["device"].annotation) == "str or null"
    assert type_name(fields["devices"].annotation) == "list of str"
    assert type_name(fields["build_cache"].annotation) == "path or null"
