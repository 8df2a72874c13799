"""The layers stay layers: imports point down, the spine names no stage, HTTP goes through one client,
vLLM is imported by the generation layer only.

Read from the source with ``ast`` (every import, also those inside functions), so a lazy import
that climbs a layer fails here as surely as a top-level one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"smolforge": "smolforge", "data": "data", "generation": "generation", "pretrain": "pretrain",
           "alignment": "alignment", "evals": "evals", "annotate": "annotate", "ops": "ops"}
# package → the packages it may import (the spine imports none of the others)
ALLOWED = {
    "smolforge": set(),
    "data": {"smolforge"},
    "generation": {"smolforge"},
    "pretrain": {"data", "smolforge"},
    "alignment": {"generation", "data", "smolforge"},
    "evals": {"pretrain", "generation", "data", "smolforge"},
    "annotate": {"generation", "data", "smolforge"},
    # the cross-stage tools (plan, doctor, burn-in, lr-find, ablate): above every stage; nothing imports ops
    "ops": {"annotate", "evals", "alignment", "pretrain", "generation", "data", "smolforge"},
}
HTTP_CALLS = ("urlopen", "requests.", "httpx.")
# the one client, the health probe, and the crowd that replays Argilla's UI submit call (the SDK would
# retry connection errors where the load and fault tests must count them)
HTTP_ALLOWED = {"generation/client.py", "smolforge/processes.py", "annotate/crowd.py"}
VLLM_ALLOWED = {"generation"}   # every other layer reaches vLLM through smolforge.generation (bench/, tests/ aside)


def imported_packages(path: Path) -> set[str]:
    """The smolforge packages a module imports (``smolforge.data.x`` → ``data``; the spine → ``smolforge``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "smolforge":
                found.add(parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "smolforge")
            elif parts[0] in FOLDERS and parts[0] != "smolforge":
                found.add(f"bare:{parts[0]}")          # `import data…`: the un-namespaced name
    return found


def vllm_imports(path: Path) -> list[str]:
    """``file:line`` of each import of vLLM in a module (``import vllm``, ``import vllm.x``, ``from vllm… import``),
    inside functions too."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        if any(name == "vllm" or name.startswith("vllm.") for name in names):
            lines.append(node.lineno)
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return [f"{where}:{line}" for line in sorted(lines)]


def modules(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))     # subpackages too (ops/plan/, …)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_the_layers_below_it(package):
    wrong = {}
    for path in modules(FOLDERS[package]):
        climbs = imported_packages(path) - ALLOWED[package] - {package}
        if climbs:
            wrong[path.name] = sorted(climbs)
    assert wrong == {}


def test_the_cli_and_the_pipeline_runner_name_no_stage():
    for name in ("cli.py", "pipeline.py", "commands.py"):
        assert imported_packages(REPO / "smolforge" / name) <= {"smolforge"}, name
        text = (REPO / "smolforge" / name).read_text()
        assert "import_module(\"smolforge." not in text


def test_http_clients_live_only_in_the_generation_client_and_the_health_probe():
    users = set()
    for folder in FOLDERS.values():
        for path in modules(folder):
            if any(call in path.read_text() for call in HTTP_CALLS):
                users.add(f"{folder}/{path.name}")
    assert users == HTTP_ALLOWED


def test_only_the_generation_layer_imports_vllm():
    found = [where for folder in sorted(set(FOLDERS.values()) - VLLM_ALLOWED) for path in modules(folder)
             for where in vllm_imports(path)]
    assert found == [], "vLLM imported outside generation/ (go through smolforge.generation): " + ", ".join(found)


def test_the_checks_above_see_a_climbing_import(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from smolforge.evals.stage import run\n    import data.jsonl\n")
    assert imported_packages(module) == {"evals", "bare:data"}


def test_the_vllm_check_sees_every_form_of_import(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("import vllm\nimport os, vllm.platforms as p\n\ndef f():\n    from vllm.platforms import x\n"
                      "    from vllm import LLM\n    from smolforge.generation import vllm_memory\n"
                      "    import vllmish\n    from .vllm import y\n")
    assert [where.rsplit(":", 1)[1] for where in vllm_imports(module)] == ["1", "2", "5", "6"]
