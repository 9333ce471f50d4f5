"""The README and docs/ as a newcomer reads them: every command they write out parses as written (the right
command, flags and tier names), every relative link leads to a file, and the README stays a page."""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"python -m (codeckv|kernels\.bench|kernels\.compile_check)\b(.*)", re.S)
README_LINES = 250


def _commands() -> list[tuple[str, str, list[str]]]:
    """(page, module, argv) of every `python -m codeckv ...` / kernels command in inline code or a code block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        lines = [line for block in blocks for line in block.splitlines()]  # a code block: one command a line
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        inline = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]  # may wrap over lines
        for span in lines + inline:
            for module, rest in COMMAND.findall(span):
                rest = rest.split("#")[0]  # a trailing shell comment
                argv = [a for a in shlex.split(rest.replace("\n", " ")) if a not in ("...", "[", "]")]
                if any(a.startswith(("<", "[")) or "|" in a for a in argv):  # a template: `quality --model <hub id>`
                    continue
                found.append((page.name, module, argv))
    return found


COMMANDS = _commands()


def test_the_docs_write_out_commands():
    assert len(COMMANDS) >= 20, "the docs quote the commands behind their figures"


@pytest.mark.parametrize("page, module, argv", COMMANDS, ids=[f"{p}: {m} {' '.join(a)}"[:90] for p, m, a in COMMANDS])
def test_every_command_parses_as_written(page, module, argv):
    if module == "codeckv":
        from codeckv.cli import build_parser

        parser = build_parser()
    elif module == "kernels.bench":
        from kernels.bench import build_parser

        parser = build_parser()
    else:
        from kernels.compile_check import build_parser

        parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:
        pytest.fail(f"{page}: `python -m {module} {' '.join(argv)}` does not parse (exit {done.code})")
    problem = getattr(args, "usage_problem", None)
    assert not (problem and problem(args)), f"{page}: {problem(args)}"


def test_every_relative_link_leads_to_a_file():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_is_a_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_LINES
