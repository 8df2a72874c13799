"""Every docstring example in the installed ``smolforge`` packages, one test per docstring.

The stage folders (data/, pretrain/, …) install as ``smolforge.data``, ``smolforge.pretrain`` …
(pyproject's package-dir mapping). pytest's ``--doctest-modules`` imports a file by its path and
would name ``data/card.py`` ``data.card``: a second copy of the module under the very name a
user's own ``data/`` folder could shadow. So the examples are collected here from the installed
names instead. ``smolforge.annotate.search_engine`` is left out: it is imported by the
argilla-server process, in its own venv, and its examples run there
(tests/test_annotate_server.py).
"""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest


PACKAGES = ["smolforge", "smolforge.data", "smolforge.generation", "smolforge.pretrain", "smolforge.alignment",
            "smolforge.alignment.ppo", "smolforge.evals", "smolforge.evals.audit", "smolforge.evals.redteam",
            "smolforge.annotate", "smolforge.ops", "smolforge.ops.plan",
            "smolforge.ops.lr_find", "smolforge.ops.ablate"]
NOT_HERE = {"smolforge.annotate.search_engine"}


def _module_names() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [info.name for info in pkgutil.iter_modules(path, package + ".")]
    return sorted(set(names) - NOT_HERE)


def _examples() -> list[tuple[str, str]]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for name in _module_names():
        module = importlib.import_module(name)
        for test in finder.find(module, name):
            if test.examples:
                found.append((name, test.name))
    return found


EXAMPLES = _examples()


def _package_of(module_name: str) -> str:
    return max((p for p in PACKAGES if module_name == p or module_name.startswith(p + ".")), key=len)


def test_every_package_shows_runnable_examples():
    assert {_package_of(name) for name, _ in EXAMPLES} == set(PACKAGES)


@pytest.mark.parametrize("module_name,test_name", EXAMPLES, ids=[t for _, t in EXAMPLES])
def test_docstring_example(module_name: str, test_name: str) -> None:
    module = importlib.import_module(module_name)
    [test] = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, module_name) if t.name == test_name]
    lines: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(test, out=lines.append)
    assert result.failed == 0, "".join(lines)
