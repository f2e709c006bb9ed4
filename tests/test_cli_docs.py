"""docs/cli.md says what the CLI does: every option of every command is documented in that
command's section, and every option a section's tables name exists."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT
from edgetrain.cli import main

DOC = (ROOT / "docs" / "cli.md").read_text()


def section(command: str) -> str:
    m = re.search(rf"^## `edgetrain {re.escape(command)}\b.*?(?=^## |\Z)", DOC, re.M | re.S)
    assert m, f"docs/cli.md has no section for `edgetrain {command}`"
    return m.group(0)


def options(command: str) -> set[str]:
    names = set()
    for p in main.commands[command].params:
        names.update(o for o in p.opts + p.secondary_opts if o.startswith("--"))
    return names - {"--help"}


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_option_is_documented_in_its_section(command):
    text = section(command)
    missing = sorted(o for o in options(command)
                     if not re.search(rf"{re.escape(o)}(?![a-z0-9-])", text))
    assert not missing, f"docs/cli.md's `edgetrain {command}` section lacks {missing}"


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_option_a_table_names_exists(command):
    first_cells = re.findall(r"^\| ([^|]*) \|", section(command), re.M)
    named = {o for cell in first_cells for o in re.findall(r"--[a-z][a-z0-9-]*", cell)}
    assert not named - options(command), sorted(named - options(command))
