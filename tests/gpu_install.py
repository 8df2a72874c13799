"""The GPU machine's ``make setup`` install as pip sees it, resolved offline by pip's real resolver.

    requirements = gpu_requirements(Path("Makefile").read_text(), Path("pyproject.toml").read_text())
    records = json.loads(Path("tests/data/gpu_resolve/metadata.json").read_text())["dists"]
    result = resolve(requirements, write_index(records, tmp_path / "index"), tmp_path)
    assert result.ok, result.output

Three parts: what ``make setup`` installs on a GPU machine (the ``$(STAMP)`` recipe's commands
outside the ``ifeq ($(HAS_GPU),)`` CPU sides: its ``$(PIP) install`` pins, and ``-e ".[extras]"``
expanded into pyproject.toml's dependencies and those extras, so the project is never built); a
local index of recorded package metadata (PEP 503 "simple" pages whose links carry PEP 658
``data-core-metadata``, a ``.metadata`` file beside each link, no distribution file at all); and
``pip install --dry-run --ignore-installed --report`` over that index, with every pip
configuration file and ``PIP_*`` variable of this machine left out, so nothing but the index is
read. In ``--dry-run`` pip takes a distribution's dependencies from its PEP 658 metadata and never
fetches the file itself (pip 26.3 does so for a ``file://`` index; pip 23.2.1 still asked for the
wheel and failed on a 404). bench/gpu_resolve.py records the metadata from PyPI.
"""
from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

STAMP_TARGET = "$(STAMP):"
TOOLING = {"pip", "wheel", "setuptools"}


def gpu_commands(makefile: str) -> list[list[str]]:
    """The commands of the ``$(STAMP)`` recipe that run on a GPU machine, as words.

    Those outside the ``ifeq ($(HAS_GPU),)`` conditionals and those of their ``else`` branches;
    comment lines (``@#``) left out, continuation lines joined.

    >>> gpu_commands('''$(STAMP): x
    ... \t$(PIP) install -U pip
    ... ifeq ($(HAS_GPU),)
    ... \t$(PIP) install torch==2.13.0
    ... else
    ... \t@# one resolve
    ... \t$(PIP) install torch==2.14.0 -e ".[test]"
    ... \t$(PIP) check
    ... endif
    ... ifeq ($(HAS_GPU),)
    ... \tbuild \\
    ... \t  --cpu
    ... endif
    ... \t@touch $(STAMP)
    ... next:
    ... \techo no
    ... ''')
    [['$(PIP)', 'install', '-U', 'pip'], ['$(PIP)', 'install', 'torch==2.14.0', '-e', '.[test]'], ['$(PIP)', 'check'], ['@touch', '$(STAMP)']]
    """
    lines = makefile.replace("\\\n", " ").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(STAMP_TARGET))
    commands: list[list[str]] = []
    runs = [True]                                  # does the current block run on a GPU machine (a stack)
    for line in lines[start + 1:]:
        word = line.strip()
        if line and not line[0].isspace() and not word.startswith(("ifeq", "ifneq", "else", "endif")):
            break                                  # the next rule: the recipe is over
        if word.startswith(("ifeq", "ifneq")):
            if word != "ifeq ($(HAS_GPU),)":
                raise ValueError(f"a conditional this reader does not know: {word}")
            runs.append(False)                     # the CPU side
        elif word == "else":
            runs[-1] = not runs[-1]
        elif word == "endif":
            runs.pop()
        elif word and not word.startswith(("@#", "#")) and all(runs):
            commands.append(shlex.split(word))
    return commands


def project_requirements(pyproject: str, extras: list[str]) -> list[str]:
    """pyproject.toml's dependencies plus those of ``extras``, a self-reference ``name[x]`` expanded in place.

    >>> project_requirements('''[project]
    ... name = "demo"
    ... dependencies = ["a>=1"]
    ... [project.optional-dependencies]
    ... core = ["b==2"]
    ... test = ["demo[core]", "c; python_version >= '3'"]
    ... ''', ["test"])
    ['a>=1', 'b==2', 'c; python_version >= "3"']
    """
    project = tomllib.loads(pyproject)["project"]
    name = canonicalize_name(project["name"])
    optional = {canonicalize_name(k): v for k, v in project.get("optional-dependencies", {}).items()}
    found: list[str] = []
    seen: set[str] = set()

    def add(requirements: list[str]) -> None:
        for text in requirements:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == name:
                expand(sorted(requirement.extras))
            elif str(requirement) not in found:
                found.append(str(requirement))

    def expand(names: list[str]) -> None:
        for extra in map(canonicalize_name, names):
            if extra not in seen:
                seen.add(extra)
                if extra not in optional:
                    raise KeyError(f"pyproject.toml has no extra {extra!r} (extras: {sorted(optional)})")
                add(optional[extra])

    add(project.get("dependencies", []))
    expand(extras)
    return found


def install_requirements(command: list[str], pyproject: str) -> list[str]:
    """The requirements of one ``$(PIP) install`` command: its pins, its ``-e .[extras]`` expanded.

    >>> install_requirements(["$(PIP)", "install", "--quiet", "torch==2.14.0", "-e", ".[test]"],
    ...     '[project]\\nname = "p"\\ndependencies = ["a"]\\n[project.optional-dependencies]\\ntest = ["b"]\\n')
    ['torch==2.14.0', 'a', 'b']
    """
    if command[:2] != ["$(PIP)", "install"]:
        raise ValueError(f"not a $(PIP) install command: {shlex.join(command)}")
    words = [w for w in command[2:] if w != "-e"]
    unknown = [w for w in words if w.startswith("-") and w not in ("--quiet", "-q", "--upgrade", "-U")]
    if unknown:
        raise ValueError(f"options this reader does not know (they may change the resolve): {unknown}")
    requirements: list[str] = []
    for word in (w for w in words if not w.startswith("-")):
        local = re.fullmatch(r"\.(?:\[([^\]]*)\])?", word)
        if local:
            extras = [e.strip() for e in (local.group(1) or "").split(",") if e.strip()]
            requirements += project_requirements(pyproject, extras)
        else:
            requirements.append(str(Requirement(word)))
    return requirements


def gpu_installs(makefile: str) -> list[list[str]]:
    """The GPU path's ``$(PIP) install`` commands that resolve the software: not ``--no-deps`` ones,
    not those that only update pip's own tooling (pip, wheel, setuptools)."""
    return [c for c in gpu_commands(makefile) if c[:2] == ["$(PIP)", "install"] and "--no-deps" not in c
            and not {w for w in c[2:] if not w.startswith("-")} <= TOOLING]


def gpu_requirements(makefile: str, pyproject: str) -> list[str]:
    """Everything ``make setup`` installs on a GPU machine, as requirements (all of :func:`gpu_installs`)."""
    found: list[str] = []
    for command in gpu_installs(makefile):
        found += [r for r in install_requirements(command, pyproject) if r not in found]
    return found


def _metadata_text(dist: dict) -> str:
    """A core-metadata file (the headers pip reads) for one recorded distribution."""
    lines = ["Metadata-Version: 2.1", f"Name: {dist['name']}", f"Version: {dist['version']}"]
    if dist.get("requires_python"):
        lines.append(f"Requires-Python: {dist['requires_python']}")
    lines += [f"Provides-Extra: {extra}" for extra in dist.get("provides_extra", [])]
    lines += [f"Requires-Dist: {requirement}" for requirement in dist.get("requires_dist", [])]
    return "\n".join(lines) + "\n\n"


def write_index(dists: list[dict], folder: Path) -> str:
    """Lay out a PEP 503 index whose links carry PEP 658 metadata; returns its ``file://`` URL.

    ``dists``: records ``{name, version, filename, requires_python, requires_dist, provides_extra}``.
    Only ``files/<filename>.metadata`` is written, never ``files/<filename>``.

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> url = write_index([{"name": "Demo_Pkg", "version": "1.0", "filename": "demo_pkg-1.0-py3-none-any.whl",
    ...                     "requires_dist": ["b>=2"]}], Path(folder.name))
    >>> page = (Path(url.removeprefix("file://")) / "demo-pkg" / "index.html").read_text()
    >>> "data-core-metadata=\\"sha256=" in page and "../../files/demo_pkg-1.0-py3-none-any.whl" in page
    True
    >>> folder.cleanup()
    """
    simple, files = folder / "simple", folder / "files"
    files.mkdir(parents=True, exist_ok=True)
    pages: dict[str, list[str]] = {}
    for dist in dists:
        metadata = _metadata_text(dist).encode()
        (files / f"{dist['filename']}.metadata").write_bytes(metadata)
        digest = hashlib.sha256(metadata).hexdigest()
        python = dist.get("requires_python")
        attrs = f' data-requires-python="{html.escape(python)}"' if python else ""
        pages.setdefault(canonicalize_name(dist["name"]), []).append(
            f'<a href="../../files/{dist["filename"]}"{attrs} data-core-metadata="sha256={digest}" '
            f'data-dist-info-metadata="sha256={digest}">{html.escape(dist["filename"])}</a><br>')
    for name, links in pages.items():
        (simple / name).mkdir(parents=True, exist_ok=True)
        (simple / name / "index.html").write_text(
            "<!DOCTYPE html>\n<html><body>\n" + "\n".join(sorted(links)) + "\n</body></html>\n")
    (simple / "index.html").write_text("<!DOCTYPE html>\n<html><body>\n" + "\n".join(
        f'<a href="{name}/">{name}</a><br>' for name in sorted(pages)) + "\n</body></html>\n")
    return simple.resolve().as_uri()


def pip_environment() -> dict[str, str]:
    """``os.environ`` without pip's settings: no ``PIP_*`` variable and no configuration file is read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull     # pip then skips every configuration file (global, user, site)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@dataclass
class Resolution:
    ok: bool                                        # pip resolved every requirement together
    output: str                                     # pip's own words (stdout + stderr)
    install: dict[str, str] = field(default_factory=dict)   # canonical name → version pip would install
    report: dict = field(default_factory=dict, repr=False)  # pip's --report

    def why(self) -> str:
        """pip's reason for failing: its conflict paragraph and ERROR lines, without the download log.

        >>> Resolution(False, "Processing x\\nERROR: No matching distribution found for y\\n").why()
        'ERROR: No matching distribution found for y'
        """
        lines = self.output.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("The conflict is caused by")), None)
        kept = lines[start:] if start is not None else [line for line in lines if line.startswith("ERROR")]
        return "\n".join(kept) or self.output[-3000:]


def resolve(requirements: list[str], index_url: str, work: Path, python: str = sys.executable,
            extra_args: tuple[str, ...] = (), cache: bool = False, timeout: float = 600) -> Resolution:
    """pip's resolver on ``requirements`` against ``index_url`` alone, nothing installed: ``--dry-run --report``.

    ``cache``: let pip use its cache (wheels it built from sdists: no rebuild when resolving on PyPI).
    """
    work.mkdir(parents=True, exist_ok=True)
    report_path = work / "report.json"
    report_path.unlink(missing_ok=True)
    (work / "requirements.txt").write_text("\n".join(requirements) + "\n")
    command = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", *(() if cache else ("--no-cache-dir",)),
               "--index-url", index_url, "--report", str(report_path), *extra_args,
               "-r", str(work / "requirements.txt")]
    ran = subprocess.run(command, capture_output=True, text=True, env=pip_environment(), cwd=work, timeout=timeout)
    report = json.loads(report_path.read_text()) if ran.returncode == 0 and report_path.exists() else {}
    install = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
               for item in report.get("install", [])}
    return Resolution(ran.returncode == 0, ran.stdout + ran.stderr, install, report)
