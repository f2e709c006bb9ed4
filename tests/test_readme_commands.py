"""Every command the README and the guides show parses as written: each `edgetrain ...` line
through the CLI's own parser (options, choices, byte sizes, required options), each `make`
line against the Makefile's targets and variables, each bench script exists. As written they
take hours (pretraining ResNet-50); test_docs_run.py executes the README's and the
quickstart's blocks with the quick settings the README documents."""
from __future__ import annotations

import re
import shlex

import click
import pytest

from conftest import ROOT
from docblocks import shell_lines
from edgetrain.cli import main

DOCS = ("README.md", "docs/quickstart.md", "docs/update-plans.md")


CASES = [(doc, line) for doc in DOCS for line in shell_lines(ROOT / doc)]


def test_the_docs_show_commands():
    assert sum(line.startswith(("edgetrain ", ".venv/bin/edgetrain ")) for _, line in CASES) >= 15


@pytest.mark.parametrize("doc, line", CASES, ids=[f"{d}:{i}" for i, (d, _) in enumerate(CASES)])
def test_command_parses_as_written(doc, line):
    for part in re.split(r"\s*&&\s*", line):
        words = shlex.split(part)
        if words[0] in ("edgetrain", ".venv/bin/edgetrain"):
            assert words[1] in main.commands, f"{doc}: no command `edgetrain {words[1]}`"
            try:
                main.commands[words[1]].make_context(words[1], words[2:])
            except click.ClickException as e:
                pytest.fail(f"{doc}: `{part}` does not parse: {e.format_message()}")
        elif words[0] == "make":
            makefile = (ROOT / "Makefile").read_text()
            for w in words[1:]:
                if "=" in w:
                    var = w.split("=")[0]
                    assert re.search(rf"^{var}\s*\?=", makefile, re.M), f"{doc}: {var} unknown"
                else:
                    assert re.search(rf"^{w}:", makefile, re.M), f"{doc}: no make target {w}"
        elif words[0].endswith("python") and len(words) > 1 and words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), f"{doc}: {words[1]} does not exist"
