"""The fenced code blocks of a Markdown document, as the docs tests read them: shell blocks
(no language, sh, bash, shell) as command lines, Python blocks as scripts."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGS = ("", "sh", "bash", "shell")
EXPECTED_EXIT = re.compile(r"#\s*exits (\d+)")  # a command shown failing on purpose says so


@dataclass(frozen=True)
class Block:
    lang: str  # "python" or a shell language ("")
    text: str
    line: int  # the line of the opening fence, 1-based

    @property
    def is_shell(self) -> bool:
        return self.lang in SHELL_LANGS


@dataclass(frozen=True)
class Command:
    line: str  # the command as written, its trailing comment stripped
    expected_exit: int  # 0 unless the doc says `# exits N`


def blocks(path: Path) -> list[Block]:
    found, inside, lang, start, body = [], False, "", 0, []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.startswith("```"):
            if inside:
                found.append(Block(lang, "\n".join(body) + "\n", start))
            inside, lang, start, body = not inside, raw[3:].strip(), number, []
        elif inside:
            body.append(raw)
    return found


def commands(block: Block) -> list[Command]:
    """A shell block's command lines: comments, prompts-free blank lines dropped."""
    out = []
    for raw in block.text.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).strip()
        if line and not line.startswith("#"):
            expected = EXPECTED_EXIT.search(raw)
            out.append(Command(line, int(expected.group(1)) if expected else 0))
    return out


def shell_lines(path: Path) -> list[str]:
    return [c.line for b in blocks(path) if b.is_shell for c in commands(b)]
