"""The ``tools`` eval suite: does the model call its tools validly, and does it answer right with them?

    smolforge eval grpo-tools --suite tools
    smolforge eval sft-tools --suite tools --set limit=16

A tool suite is a folder with ``tools.yaml`` (which tools are on offer, how many rounds of calls, the
answer length) and ``items.jsonl`` of ``{"prompt": [messages], "answer"}`` rows. The built-in one
(``evals/suites/tools``) holds the embedded world's 64 held-out three-digit sums
(:meth:`smolforge.data.synthetic.World.tool_problems`), never seen in training. Each item is answered
greedily through :func:`smolforge.generation.tool_loop.answer_with_tools` (the calls run in
:mod:`smolforge.generation.tools`) and scored:

- ``tools/accuracy``: the final answer states the expected one (``answer_match`` = 1);
- ``tools/call_validity``: valid calls (an offered tool, its exact arguments, parsable) over all calls written;
- ``tools/called``: the share of items answered with at least one call.

Results go to ``runs/<run>/eval/<name>.json`` and ``<name>-samples.jsonl`` (every transcript), the three
figures (with their standard errors) into run.json's metrics.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from smolforge.errors import RecipeError, RunError
from smolforge.runs import Run, atomic_writer, write_json_atomic

SUITE_FILE = "tools.yaml"
ITEMS_FILE = "items.jsonl"


def is_tool_suite(ref: str | Path) -> bool:
    """Whether ``ref`` (a suite name or folder) is a tool-use suite.

    >>> is_tool_suite("tools"), is_tool_suite("embedded"), is_tool_suite("no-such-suite")
    (True, False, False)
    """
    from .suite import suite_path

    try:
        return (suite_path(str(ref)) / SUITE_FILE).is_file()
    except RecipeError:
        return False


def load_tool_suite(ref: str | Path) -> dict:
    """The suite's settings and items, checked (file, line, field).

    >>> suite = load_tool_suite("tools")
    >>> suite["name"], suite["tools"], len(suite["items"]), suite["items"][0]["prompt"][0]["role"]
    ('tools', ['calculator'], 64, 'user')
    """
    import yaml

    from smolforge.data.jsonl import read_jsonl
    from smolforge.generation.tools import resolve_tools

    from .suite import suite_path

    folder = suite_path(str(ref))
    settings = yaml.safe_load((folder / SUITE_FILE).read_text()) or {}
    if not isinstance(settings, dict):
        raise RecipeError(f"{folder / SUITE_FILE}: expected a mapping of settings")
    tools = settings.get("tools") or []
    resolve_tools(tools)
    items = []
    for line, row in read_jsonl(folder / ITEMS_FILE):
        where = f"{folder / ITEMS_FILE} line {line}"
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
            raise RecipeError(f"{where}: field 'prompt' must be a list of messages")
        if not isinstance(row.get("answer"), str):
            raise RecipeError(f"{where}: field 'answer' must be a string")
        items.append(row)
    if not items:
        raise RecipeError(f"{folder / ITEMS_FILE}: no items")
    return {"name": settings.get("name") or folder.name, "folder": str(folder), "tools": tools,
            "max_iterations": int(settings.get("max_iterations", 2)),
            "max_new_tokens": int(settings.get("max_new_tokens", 96)), "items": items}


def _share(hits: list[bool]) -> tuple[float | None, float | None]:
    """(mean, standard error) of 0/1 outcomes; (None, None) without any."""
    if not hits:
        return None, None
    p = sum(hits) / len(hits)
    return round(p, 5), round(math.sqrt(p * (1 - p) / len(hits)), 5)


def score_tools(model, tokenizer, suite: dict, *, limit: int | None = None, batch_size: int = 32) -> dict:
    """Answer the suite's items with its tools and score them (see the module text)."""
    from smolforge.generation.tool_loop import answer_with_tools
    from smolforge.generation.verifiers import answer_match, completion_text

    items = suite["items"][:limit] if limit else suite["items"]
    started = time.perf_counter()
    transcripts = answer_with_tools(model, tokenizer, [row["prompt"] for row in items], suite["tools"],
                                    max_new_tokens=suite["max_new_tokens"], max_iterations=suite["max_iterations"],
                                    batch_size=batch_size)
    correct = [score == 1.0 for score in answer_match(
        [row["prompt"] for row in items], [t.answer for t in transcripts], answer=[row["answer"] for row in items])]
    calls = [t.calls for t in transcripts]
    valid_calls = [bool(v) for t in transcripts for v in [1] * t.valid_calls + [0] * (t.calls - t.valid_calls)]
    accuracy, accuracy_se = _share(correct)
    validity, validity_se = _share(valid_calls)
    called, called_se = _share([c > 0 for c in calls])
    samples = [{"id": row.get("id", i), "prompt": row["prompt"], "answer": row["answer"], "transcript": t.messages, "final": t.answer,
                "calls": t.calls, "valid_calls": t.valid_calls, "correct": ok,
                "text": completion_text(t.messages)} for i, (row, t, ok) in enumerate(zip(items, transcripts, correct))]
    return {"suite": suite["name"], "items": len(items), "tools": suite["tools"],
            "accuracy": accuracy, "accuracy_stderr": accuracy_se, "call_validity": validity,
            "call_validity_stderr": validity_se, "called": called, "called_stderr": called_se,
            "calls": sum(calls), "seconds": round(time.perf_counter() - started, 2), "samples": samples}


def evaluate_tool_suite(run: Run, ref: str | Path = "tools", *, limit: int | None = None, batch_size: int = 32,
                        device: str = "cpu") -> dict:
    """Score ``run``'s model on the tool suite ``ref`` and write the results into the run."""
    import torch
    from transformers import AutoModelForCausalLM

    from smolforge.generation.prompts import load_tokenizer
    from smolforge.generation.tool_loop import parses_calls

    if not (run.model_dir / "config.json").is_file():
        raise RunError(f"run '{run.name}' (stage {run.stage}) has no model/ to evaluate")
    suite = load_tool_suite(ref)
    tokenizer = load_tokenizer(run.model_dir)
    if not parses_calls(tokenizer):
        try:
            from trl.chat_template_utils import add_response_schema

            add_response_schema(tokenizer)
        except Exception:  # noqa: BLE001 - TRL knows only some templates; say which way out there is
            raise RecipeError(f"run '{run.name}': its chat template has no tool-call format smolforge can parse "
                              "(the demo tokenizer, SmolLM3, Qwen, Llama have one)") from None
    model = AutoModelForCausalLM.from_pretrained(run.model_dir, dtype=torch.float32).to(device)
    result = score_tools(model, tokenizer, suite, limit=limit, batch_size=batch_size)
    result["run"] = run.name
    samples = result.pop("samples")
    name = result["suite"]
    write_json_atomic(run.eval_dir / f"{name}.json", result)
    with atomic_writer(run.eval_dir / f"{name}-samples.jsonl") as out:
        for sample in samples:
            out.write(json.dumps(sample) + "\n")
    run.update_metrics({f"{name}/{key}": result[key] for key in ("accuracy", "call_validity", "called")
                        if result[key] is not None}
                       | {f"{name}/{key}/stderr": result[f"{key}_stderr"] for key in ("accuracy", "call_validity",
                                                                                      "called")
                          if result[f"{key}_stderr"] is not None})
    result["samples"] = samples
    return result


def format_result(result: dict) -> str:
    """The printed summary of one scoring.

    >>> print(format_result({"suite": "tools", "items": 4, "accuracy": 0.5, "accuracy_stderr": 0.25,
    ...                      "call_validity": 1.0, "call_validity_stderr": 0.0, "called": 1.0, "called_stderr": 0.0,
    ...                      "calls": 4}))
    tools: 4 items, 4 tool calls
      accuracy       0.500 ± 0.250
      call_validity  1.000 ± 0.000
      called         1.000 ± 0.000
    """
    lines = [f"{result['suite']}: {result['items']} items, {result['calls']} tool calls"]
    for key in ("accuracy", "call_validity", "called"):
        value = result[key]
        shown = "–" if value is None else f"{value:.3f} ± {result[key + '_stderr']:.3f}"
        lines.append(f"  {key:<14} {shown}")
    return "\n".join(lines)


def write_builtin_suite(folder: Path) -> None:
    """Write the built-in tool suite from the embedded world (what ``evals/suites/tools`` holds)."""
    from smolforge.data.synthetic import World

    folder.mkdir(parents=True, exist_ok=True)
    with atomic_writer(folder / ITEMS_FILE) as out:
        for row in World.tool_prompts("heldout"):
            out.write(json.dumps({"prompt": row["prompt"], "answer": row["answer"]}) + "\n")
