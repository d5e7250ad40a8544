"""The documentation's examples, read from its Markdown: each ```sh and ```python block
runs, and the ```text block titled "Output" that follows one is what it must print.

- An output is matched with every space and line break left out of both, `...` standing
  for any text (so a long JSON answer can be shown in part, and wrapped).
- A shell line that starts the service (`distilserve serve ...`, after any `NAME=value`
  settings) starts it in the background instead, on free ports put in place of 8000 and
  8001 throughout the page, and waits until it is ready; it is stopped when the page ends.
  A page that starts none talks to a service of the embedded default.
- A block after an HTML comment `<!-- not run: why -->` is shown and not run (a cluster,
  Docker, a GPU, an hour of training), and must say why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\w+)?([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")
SERVE = re.compile(r"^((?:[A-Z_]+=\S+\s+)*)distilserve serve\b(.*)$")


@dataclass
class Block:
    language: str
    code: str
    line: int
    output: str | None = None
    not_run: str | None = None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    @property
    def starts_a_server(self) -> bool:
        return any(SERVE.match(line.strip()) for b in self.runnable if b.language == "sh"
                   for line in shell_lines(b.code))

    @property
    def runnable(self) -> list[Block]:
        return [b for b in self.blocks if b.not_run is None]


def shell_lines(code: str) -> list[str]:
    """A shell block's commands, a line each: continuation lines joined."""
    return code.replace("\\\n", " ").splitlines()


def read(path: Path) -> Page:
    text = path.read_text()
    page = Page(path)
    for match in FENCE.finditer(text):
        language, info, code = match.group(1) or "", match.group(2), match.group(3)
        before = text[:match.start()].rstrip().splitlines()
        line = text.count("\n", 0, match.start()) + 1
        if language == "text" and 'title="Output"' in info:
            assert page.blocks and page.blocks[-1].output is None, \
                f"{path}:{line}: an output block follows no example"
            page.blocks[-1].output = code
            continue
        if language not in ("sh", "python"):
            continue
        reason = NOT_RUN.search(before[-1]) if before else None
        page.blocks.append(Block(language, code, line, not_run=reason and reason.group(1)))
    return page


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is ``expected`` with each `...` standing for any text, spaces
    and line breaks left out of both."""
    squash = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    pattern = ".*?".join(re.escape(part) for part in squash(expected).split("..."))
    return re.fullmatch(pattern, squash(actual), re.S) is not None


def with_ports(code: str, http: int, grpc: int) -> str:
    return re.sub(r"\b8001\b", str(grpc), re.sub(r"\b8000\b", str(http), code))
