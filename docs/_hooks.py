"""MkDocs hooks: the results pages that live beside what they measure (bench/, loadtests/)
join the site as they are, and the settings and command-line references and the OpenAPI
document are generated from the code (the settings class, the argument parser, the app),
so that they cannot drift."""

from __future__ import annotations

import argparse
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ["bench/**/*.md", "bench/**/*.png", "loadtests/*.md"]


def on_files(files, config):
    for pattern in RESULTS:
        for path in sorted(ROOT.glob(pattern)):
            files.append(File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"],
                              config["use_directory_urls"]))
    files.append(File.generated(config, "reference/openapi.json", content=openapi()))
    return files


def openapi() -> str:
    """The service's OpenAPI document, as /openapi.json serves it (without an API key)."""
    import json

    from distilserve.server.app import create_app

    return json.dumps(create_app().openapi(), indent=1)


GENERATED = {"<!-- generated: settings -->": lambda: settings_table(),
             "<!-- generated: cli -->": lambda: cli_reference()}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:  # (made for the page that asks, not for every page)
            markdown = markdown.replace(marker, make())
    return markdown


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def settings_table() -> str:
    from distilserve.server.settings import Settings

    flags = _serve_flags()
    rows = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if default is None or default == "":
            default = "none"
        elif isinstance(default, Path):
            default = str(default).replace(str(Path.home()), "~")
        elif isinstance(default, bool):
            default = str(default).lower()
        flag = f"`{flags[name]}`" if name in flags else ""
        rows.append(f"| `DISTILSERVE_{name.upper()}` | {flag} | `{_cell(default)}` | "
                    f"{_cell(field.description)} |")
    return "\n".join(rows)


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from distilserve.server.cli import parser

    (sub,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _serve_flags() -> dict[str, str]:
    return {a.dest: a.option_strings[0] for a in _subcommands()["serve"]._actions
            if a.option_strings and a.dest != "help"}


def cli_reference() -> str:
    out = []
    for name, command in _subcommands().items():
        out += [f"## distilserve {name}", "", "```text", command.format_usage().strip(),
                "```", "", _cell(command.description or ""), "",
                "| argument | default | meaning |", "|---|---|---|"]
        for action in command._actions:
            if action.dest == "help":
                continue
            names = ", ".join(action.option_strings) or action.dest
            choices = f" ({', '.join(map(str, action.choices))})" if action.choices else ""
            default = ("" if action.default in (None, False, argparse.SUPPRESS)
                       else f"`{action.default}`")
            out.append(f"| `{names}` | {default} | {_cell(action.help or '')}{_cell(choices)} |")
        out.append("")
    return "\n".join(out)
