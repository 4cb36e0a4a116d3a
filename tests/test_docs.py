"""The documentation holds together: no reference to files users do not have,
and every relative link and every ``docs/...md#anchor`` resolves.

Anchors are computed the way GitHub renders headings (lower case,
punctuation dropped, spaces to hyphens, ``-1``, ``-2`` for repeats); an
explicit ``<a id="...">`` or ``<a name="...">`` counts too. Links inside
code blocks and code spans are not links.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Reference material fedsim was written from, which is not in the repository;
# the names are split so that this file does not name them itself.
MISSING = tuple(
    name.encode()
    for name in ("ALGORITHMS" + ".md", "MEASUREMENTS" + ".md", "NETEM-" + "REFERENCE")
)

SKIP_DIRS = {".git", ".venv", "venv", "runs", "build", "dist", "node_modules",
             "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
CODE_DIRS = ("fedsim", "netem", "tests", "tools", "scenarios", "examples", "docs")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)\s*=\s*["']([^"']+)["']""")
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
DOC_REF = re.compile(r"\bdocs/[A-Za-z0-9_][A-Za-z0-9_./-]*?\.md(?:#[A-Za-z0-9_-]+)?")


def repo_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (a directory walk without git)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*")
                 if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in paths if p.is_file())


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """Markdown lines outside fenced code blocks, with their line numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    kept = (ch for ch in text.lower()
            if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a markdown file defines."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        out.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def problem(base: Path, target: str) -> str | None:
    """Why ``target``, relative to ``base``'s directory, does not resolve (None: it does)."""
    path_part, _, anchor = target.partition("#")
    dest = (base.parent / path_part).resolve() if path_part else base
    if not dest.exists():
        return f"{path_part}: no such file or directory"
    if anchor:
        if dest.suffix != ".md":
            return f"#{anchor}: anchors are checked in markdown files only"
        if anchor not in anchors(dest):
            return f"#{anchor}: no such heading in {dest.relative_to(ROOT)}"
    return None


def markdown_links(path: Path) -> Iterator[tuple[int, str]]:
    """Relative link targets of a markdown file (external links left out)."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        ref = REF_LINK.match(line)
        targets = [ref.group(1)] if ref else []
        targets += INLINE_LINK.findall(CODE_SPAN.sub("", line))
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            yield number, target


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_slug_follows_github() -> None:
    assert github_slug("R-DG3") == "r-dg3"
    assert github_slug("FedOpt: FedAdam, FedYogi, FedAdagrad, FedAvgM") == (
        "fedopt-fedadam-fedyogi-fedadagrad-fedavgm")
    assert github_slug("Suspension: `hang_factor` x run time") == (
        "suspension-hang_factor-x-run-time")
    assert github_slug("See [the docs](architecture.md) — now") == "see-the-docs--now"


def test_no_file_names_the_reference_material_users_do_not_have() -> None:
    offenders = []
    for path in repo_files():
        data = path.read_bytes()
        for name in MISSING:
            if name in data:
                offenders.append(f"{path.relative_to(ROOT)}: {name.decode()}")
    assert not offenders, "point these at docs/ instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [f"{page.relative_to(ROOT)}:{n}: {t}: {why}"
              for n, t in markdown_links(page) if (why := problem(page, t))]
    assert not broken, "\n".join(broken)


def test_every_docs_reference_in_the_code_resolves() -> None:
    """``docs/algorithms.md#r-dg3`` in a comment, a docstring or a scenario must exist."""
    broken, found = [], 0
    files = [p for p in repo_files()
             if p.relative_to(ROOT).parts[0] in CODE_DIRS or p.parent == ROOT]
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for ref in DOC_REF.findall(line):
                found += 1
                if why := problem(ROOT / "README.md", ref):
                    broken.append(f"{path.relative_to(ROOT)}:{number}: {ref}: {why}")
    assert found, "no docs/ reference found: is the pattern still right?"
    assert not broken, "\n".join(broken)


ARCHITECTURE = ROOT / "docs" / "architecture.md"
MODULE_PATH = re.compile(r"(?<![\w/.-])((?:fedsim|netem)/[\w/]*\w(?:\.py)?/?)")
DOTTED_NAME = re.compile(r"(?<![\w./-])((?:fedsim|netem)(?:\.\w+)+)")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute (chain) of one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        value: object = module
        for attr in parts[i:]:
            if not hasattr(value, attr):
                return False
            value = getattr(value, attr)
        return True
    return False


def test_every_module_architecture_md_names_exists() -> None:
    """A file path (``fedsim/wire/codec.py``) or a dotted name
    (``fedsim.actors.checkpoint.load_checkpoint``) in docs/architecture.md is
    real: a module moved or renamed fails here until the page follows."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    paths = sorted(set(MODULE_PATH.findall(text)))
    names = sorted(set(DOTTED_NAME.findall(text)))
    assert len(paths) > 20  # the patterns find what the page names
    assert len(names) > 5
    assert [p for p in paths if not (ROOT / p).exists()] == []
    assert [n for n in names if not resolves(n)] == []


def test_architecture_md_names_every_actor_module() -> None:
    named = set(MODULE_PATH.findall(ARCHITECTURE.read_text(encoding="utf-8")))
    actors = sorted(p.relative_to(ROOT).as_posix()
                    for p in (ROOT / "fedsim" / "actors").glob("*.py") if p.name != "__init__.py")
    assert len(actors) > 10
    assert [m for m in actors if m not in named] == []


def readme_layout() -> dict[str, str]:
    """README.md's layout block under ``fedsim/``: each name (``wire/``, ``api.py``) -> its job."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    rows: dict[str, str] = {}
    current: list[str] = []
    for line in block.splitlines():
        if not line.startswith("  "):  # a top-level entry: fedsim/ itself, netem/, tools/, ...
            current = []
            continue
        names, job = line[:20].strip(), line[20:].strip()
        if names:
            current = [n.strip() for n in names.split(",")]
        for name in current:
            rows[name] = f"{rows.get(name, '')} {job}".strip()
    return rows


def test_the_readme_layout_is_the_tree() -> None:
    """Every package and loose module of fedsim is in README.md's layout with its
    job, and every name the layout gives (``wire/``, ``codec.py``) exists there."""
    rows = readme_layout()
    fedsim = ROOT / "fedsim"
    tree = {f"{p.name}/" for p in fedsim.iterdir() if (p / "__init__.py").is_file()}
    tree |= {p.name for p in fedsim.glob("*.py") if p.name != "__init__.py"}
    assert len(tree) > 10
    assert sorted(tree - set(rows)) == []  # each is listed
    assert sorted(set(rows) - tree) == []  # each listed one exists
    missing = []
    for name, job in rows.items():
        assert job, f"{name} has no job in the layout"
        if name.endswith("/"):
            for module in re.findall(r"([\w*]+\.py)\b", job):  # _server_*.py: a glob
                if not list((fedsim / name).glob(module)):
                    missing.append(f"fedsim/{name}{module}")
    assert missing == []


def test_the_readme_layout_lists_every_top_level_directory() -> None:
    """The layout block's top-level entries are the repository's directories (hidden
    ones aside), and each module a package's row names (``server.py``) is in it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    top = {line.split()[0] for line in block.splitlines() if line and not line[0].isspace()}
    made = ("runs", "build", "dist", "__pycache__")  # what using the project creates
    dirs = {p.name + "/" for p in ROOT.iterdir()
            if p.is_dir() and not p.name.startswith(".") and p.name not in made
            and not p.name.endswith(".egg-info")}
    assert sorted(dirs - top) == []
    assert sorted(top - dirs) == []
    missing = []
    for name, job in readme_layout().items():
        if not name.endswith("/"):
            continue
        for module in re.findall(r"(?<![\w*])(\w+\.py)\b", job):
            if not (ROOT / "fedsim" / name / module).exists():
                missing.append(f"fedsim/{name}{module}")
    assert missing == []


def test_every_bare_module_name_in_architecture_md_exists() -> None:
    """A module named without its path (``uplinks.py``) is a file of the project."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    names = set(re.findall(r"(?<![\w/*.-])(\w+\.py)\b", text))
    files = {p.name for d in ("fedsim", "netem", "tools", "tests")
             for p in (ROOT / d).rglob("*.py")}
    assert len(names) > 5
    assert sorted(names - files) == []
