"""The eval stage's backends (HF, in-process vLLM, endpoint), parity checks and staged lm-eval tasks.

HF against an endpoint, document by document, runs in test_serve.py through the server that
`smolforge serve` starts there (one vLLM start for both)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from conftest import REPO, needs_vllm
from smolforge.errors import DataError, RecipeError, ServiceError
from smolforge.recipe import build_stage_recipe
from smolforge.registry import load_stage


def eval_recipe(**changes):
    return build_stage_recipe(load_stage("eval"), {"suite": "embedded", **changes}, source="eval (test)")


@pytest.mark.slow
@needs_vllm
def test_in_process_vllm_matches_hf_through_the_cli(runs, sft_run):
    # its own process: an in-process vLLM engine patches transformers for the rest of the process
    done = subprocess.run([sys.executable, "-m", "smolforge", "--runs-dir", str(runs.root), "eval", sft_run.name,
                           "--backend", "vllm", "--check-parity", "hf", "--limit", "6", "--tasks", "[facts,instruct]"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "parity of vllm and hf" in done.stdout
    report = json.loads((sft_run.eval_dir / "embedded-parity.json").read_text())
    assert report["agree"] and set(report["tasks"]) == {"facts", "instruct"}


class NotJSON(BaseHTTPRequestHandler):
    """A gateway that lists the model (the eval's check before scoring passes), then answers HTML."""

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"data": [{"id": self.server.served}]}).encode())

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"<html>gateway says hi</html>")

    def log_message(self, *args):
        pass


def test_an_endpoint_answering_malformed_json_is_named(runs, sft_run):
    server = HTTPServer(("127.0.0.1", 0), NotJSON)
    server.served = sft_run.name
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        recipe = eval_recipe(run=sft_run.name, limit=2, tasks=["facts"], backend="endpoint", endpoint=url)
        with pytest.raises(ServiceError, match=r"^POST http://127\.0\.0\.1:\d+/v1/completions: the reply is not JSON: .*"
                                               r"\(a log-likelihood request for \d+ sequences \(first: \d+ tokens\)\)$"):
            load_stage("eval").run(recipe, runs)
    finally:
        server.shutdown()


def test_unknown_suites_and_tasks_name_close_matches(runs, sft_run):
    from smolforge.evals.standard_tasks import stage_task

    stage = load_stage("eval")
    with pytest.raises(RecipeError, match=r"suite 'embeded' not found \(did you mean 'embedded'"):
        stage.validate(eval_recipe(run=sft_run.name, suite="embeded"), runs)
    with pytest.raises(RecipeError, match=r"has no task 'fact' \(did you mean 'facts'\?\)"):
        stage.validate(eval_recipe(run=sft_run.name, tasks=["fact"]), runs)
    with pytest.raises(RecipeError, match="lm-eval has no task 'arc_esy'; did you mean arc_easy"):
        stage_task("arc_esy", __file__)
    with pytest.raises(RecipeError, match="parity: compares two backends"):
        stage.validate(eval_recipe(run=sft_run.name, parity="hf"), runs)


ARC_ROWS = [
    {"id": "q1", "question": "What does Bo eat?", "answerKey": "A",
     "choices": {"text": ["rice", "stone", "glass", "iron"], "label": ["A", "B", "C", "D"]}},
    {"id": "q2", "question": "What is 2 plus 3?", "answerKey": "B",
     "choices": {"text": ["4", "5", "6", "7"], "label": ["A", "B", "C", "D"]}},
    {"id": "q3", "question": "Where does Zuwyndra live?", "answerKey": "A",
     "choices": {"text": ["Drummo", "Paris", "Rome"], "label": ["A", "B", "C"]}},
]


@pytest.mark.slow
def test_a_standard_task_runs_offline_on_staged_data(runs, sft_run, tmp_path, monkeypatch):
    from smolforge.evals.standard_tasks import stage_task

    monkeypatch.setenv("SMOLFORGE_STAGED", str(tmp_path / "staged"))
    source = tmp_path / "arc.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ARC_ROWS))
    (tmp_path / "arc.csv").write_text("id,question\n")
    with pytest.raises(DataError, match="expected a .jsonl file"):
        stage_task("arc_easy", tmp_path / "arc.csv")
    folder = stage_task("arc_easy", source)
    assert folder == tmp_path / "staged" / "arc_easy"
    staged = (folder / "arc_easy.yaml").read_text()
    assert "include: " in staged and "lm_eval/tasks/arc/arc_easy.yaml" in staged and "sha256: " in staged
    stage = load_stage("eval")
    recipe = eval_recipe(run=sft_run.name, suite="arc_easy")
    stage.validate(recipe, runs)
    stage.run(recipe, runs)
    result = json.loads((sft_run.eval_dir / "arc_easy.json").read_text())
    task = result["tasks"]["arc_easy"]
    assert task["documents"] == 3 and 0.0 <= task["scores"]["acc"] <= 1.0
    assert task["random_baseline"] == pytest.approx((1 / 4 + 1 / 4 + 1 / 3) / 3, abs=1e-4)
    assert "arc_easy/acc" in sft_run.reload().metrics
