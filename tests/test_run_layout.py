"""The run folder's layout is code: stages reach its entries through the accessors, and the docs'
table is rendered from the same rows.

Read from the source with ``ast``: a ``<x>.path / "name"`` (or ``run_dir / "name"``) or a
``"run.json"`` outside the layout's own modules is a path built by hand, and fails here with its
file and line.
"""
from __future__ import annotations

import ast
from pathlib import Path

from smolforge.run_layout import LAYOUT, RunLayout, with_layout

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("smolforge", "data", "generation", "pretrain", "alignment", "evals", "annotate", "ops")
LAYOUT_MODULES = {"smolforge/runs.py", "smolforge/run_layout.py"}
RUN_FOLDER_NAMES = ("run_dir", "run_folder", "run_path")   # also data_run_path, ...
DOC = REPO / "docs" / "run-folder.md"


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _is_run_folder(node: ast.expr) -> bool:
    """``<anything>.path`` or a name that says it is a run folder (``run_dir``, ``data_run_path``...)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "path"
    return isinstance(node, ast.Name) and node.id.endswith(RUN_FOLDER_NAMES)


def hand_built_paths(source: str, where: str) -> list[str]:
    """``where:line: code`` for each run-folder path built by hand in ``source``."""
    tree = ast.parse(source, filename=where)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
                and isinstance(node.right.value, str) and _is_run_folder(node.left)):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and node.value == "run.json" and id(node) not in docstrings:
            found.append(f"{where}:{node.lineno}: 'run.json'")
    return sorted(found, key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def test_the_check_names_each_hand_built_path():
    source = '''
def write(run, run_dir, data_run_path):
    """Writes run.path / "x" and "run.json" (a docstring: not code)."""
    (run.path / "rl" / "rollouts").mkdir()
    open(run_dir / "slurm")
    exists = (data_run_path / "run.json").is_file()
    fine = run.rollouts_dir / "weights-1", run.model_dir / "config.json", "run.json is named in a message"
'''
    assert hand_built_paths(source, "stage.py") == [
        "stage.py:4: run.path / 'rl'", "stage.py:5: run_dir / 'slurm'",
        "stage.py:6: data_run_path / 'run.json'", "stage.py:6: 'run.json'"]


def test_stages_build_no_run_folder_path_by_hand():
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative not in LAYOUT_MODULES:
                found += hand_built_paths(path.read_text(encoding="utf-8"), relative)
    assert found == [], ("build these with the accessors of smolforge/run_layout.py (run.tokenizer_dir, "
                         "RunLayout(folder).slurm_job_path, is_run(folder), runs.exists(name) ...):\n"
                         + "\n".join(found))


def test_every_layout_row_is_an_accessor():
    rows = [name for name in vars(RunLayout) if name in LAYOUT]
    assert rows == list(LAYOUT)
    run = RunLayout("/r/x")
    assert [str(getattr(run, name)) for name in ("json_path", "model_dir", "heldout_path", "slurm_dir")] == [
        "/r/x/run.json", "/r/x/model", "/r/x/rl/heldout.jsonl", "/r/x/slurm"]


def test_the_docs_table_is_the_one_the_code_renders():
    text = DOC.read_text(encoding="utf-8")
    assert with_layout(text) == text, (
        "docs/run-folder.md's table differs from smolforge.run_layout.LAYOUT; regenerate it with\n"
        "    .venv/bin/python -m smolforge.run_layout docs/run-folder.md")
