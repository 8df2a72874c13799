"""Score a run's model on an evaluation suite with lm-eval, and write the scores into that run.

    smolforge eval sft-demo                                   # the embedded suite, HF in-process
    smolforge eval sft-demo --suite embedded --backend endpoint      # through `smolforge serve`
    smolforge eval sft-demo --check-parity                    # hf and endpoint; a per-task diff table
    smolforge eval --config recipes/demo/eval.yaml --set run=pretrain-demo --set limit=20

Runs lm-eval's ``simple_evaluate`` on the model in ``runs/<run>/model/`` through one of the
backends of :mod:`smolforge.evals.backends` (``hf``, ``vllm``, ``endpoint``): plain tasks as raw text,
chat tasks (``metadata.chat`` in the task YAML) through the tokenizer's chat template. Writes
``runs/<run>/eval/<suite>.json`` (scores, stderr, random baselines, backend, chat template
hash, few-shot settings), ``eval/<suite>-samples.jsonl`` (every prompt and answer), merges
``<task>/<metric>`` scores and ``<task>/<metric>/random`` baselines (primary metric) into the
run's ``run.json`` metrics, and prints a table. With ``parity: BACKEND`` (``--check-parity``)
the suite is scored a second time on that backend and ``eval/<suite>-parity.json`` compares
the two per task and per document (:mod:`smolforge.evals.parity`); a difference beyond the tolerance
fails the command. A red-team suite (a folder with ``suite.yaml``, :mod:`smolforge.evals.redteam`) is
scored by generation and rules instead of lm-eval.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from pathlib import Path
from dataclasses import dataclass, field

from smolforge.errors import RecipeError, RunError
from smolforge.model_folder import check_model_folder
from smolforge.runs import Run, Runs, atomic_writer, write_json_atomic
from smolforge.table import render_table

from .long_context import rope_overrides
from .suite import Suite, SuiteTask, load_suite

log = logging.getLogger(__name__)


@dataclass
class Recipe:
    run: str = "pretrain-demo"        # run whose model/ is scored; results land in that run
    suite: str = "embedded"           # folder under evals/suites/ or a path to a suite folder
    tasks: list = field(default_factory=list)  # subset of the suite's tasks (empty = all)
    limit: int | None = None          # documents per task (None = all), for quick checks
    batch_size: int = 32              # lm-eval batch size
    device: str = "auto"              # auto | cpu | cuda
    name: str | None = None           # label only: the results are written into `run`
    backend: str = "hf"               # hf | vllm (in-process engine) | endpoint (OpenAI-compatible server)
    endpoint: str | None = None       # base URL (…/v1) for backend endpoint; unset: smolforge serves the run
    served_name: str | None = None    # model name at the endpoint (default: the run name)
    parity: str | None = None         # a second backend to score the same tasks with, then compare
    num_fewshot: int | None = None    # few-shot examples per prompt (None: each task's own setting)
    max_new_tokens: int = 128         # red-team suites: reply length
    max_gen_toks: int | None = None   # lm-eval generation tasks: most new tokens per answer (None: each task's own, else lm-eval's 256)
    modes: list = field(default_factory=list)  # chat tasks once per reasoning mode: [think, no_think] (SmolLM3's flags)
    rope_scaling: dict = field(default_factory=dict)  # e.g. {rope_type: yarn, factor: 2}: score past the trained length
    staged_from: str | None = None    # a .jsonl of a standard lm-eval task's documents (the hub dataset's columns):
                                      #   `suite` names the task, staged from this file first (smolforge eval stage)


MODES = ("think", "no_think")   # the system-prompt flags of SmolLM3's dual-mode chat template

LM_EVAL_MAX_GEN_TOKS = 256   # what lm-eval generates at most when a task's generation_kwargs say nothing


def validate(recipe: Recipe, runs: Runs) -> None:
    from .backends import BACKENDS

    target = runs.get(recipe.run)
    if not (target.model_dir / "config.json").is_file():
        raise RunError(f"run '{target.name}' (stage {target.stage}) has no model/ to evaluate")
    check_model_folder(target.model_dir, f"run '{target.name}'")
    for field_name in ("backend", "parity"):
        value = getattr(recipe, field_name)
        if value is not None and value not in BACKENDS:
            raise RecipeError(f"{field_name} must be one of {', '.join(BACKENDS)}, got {value!r}")
    if recipe.parity is not None and recipe.parity == recipe.backend:
        raise RecipeError(f"parity: compares two backends; both are {recipe.backend!r}")
    if recipe.staged_from is not None:  # rows checked, then staged (not a run folder: the staged-suites cache)
        from .standard_tasks import stage_task

        stage_task(recipe.suite, recipe.staged_from)
    if _is_redteam(recipe.suite) or _is_tools(recipe.suite):
        if recipe.parity:
            raise RecipeError("parity applies to lm-eval suites, not to red-team or tool suites")
        if _is_tools(recipe.suite):
            from .tool_use import load_tool_suite

            load_tool_suite(recipe.suite)
            if recipe.backend != "hf":
                raise RecipeError(f"the tool suite runs its tool loop in-process: backend hf, got {recipe.backend!r}")
        return
    suite = load_suite(recipe.suite)
    if recipe.max_gen_toks is not None and recipe.max_gen_toks < 1:
        raise RecipeError(f"max_gen_toks must be >= 1 or null, got {recipe.max_gen_toks}")
    context = _max_length(target.model_dir, recipe.rope_scaling)
    for task in _selected(recipe, suite):
        _check_fewshot(suite.tasks[task], recipe.num_fewshot)
        _check_generation(suite.tasks[task], recipe.max_gen_toks, context)
    if recipe.limit is not None and recipe.limit < 1:
        raise RecipeError(f"limit must be >= 1 or null, got {recipe.limit}")
    bad_modes = [m for m in recipe.modes if m not in MODES]
    if bad_modes or len(set(recipe.modes)) != len(recipe.modes):
        raise RecipeError(f"modes: each of {', '.join(MODES)} at most once, got {recipe.modes!r}")
    rope_overrides(target.model_dir, recipe.rope_scaling)


def _selected(recipe: Recipe, suite: Suite) -> list[str]:
    unknown = [t for t in recipe.tasks if t not in suite.tasks]
    if unknown:
        import difflib

        hints = [f"'{t}'" + (f" (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(t, suite.tasks, 1)) else "")
                 for t in unknown]
        raise RecipeError(f"suite '{suite.name}' has no task {', '.join(hints)}; its tasks: {', '.join(sorted(suite.tasks))}")
    return list(recipe.tasks) or sorted(suite.tasks)


def _check_fewshot(task: SuiteTask, num_fewshot: int | None) -> None:
    """A task staged with its evaluation documents only has no few-shot examples to draw from."""
    config = task.config
    if num_fewshot and "staged_from" in (config.get("metadata") or {}) and config.get("fewshot_split") is None \
            and (config.get("fewshot_config") or {}).get("samples") == []:
        raise RecipeError(f"num_fewshot={num_fewshot}: task '{task.name}' was staged with its evaluation documents "
                          f"only (smolforge eval stage), so there are no few-shot examples to draw; score it 0-shot")


def _check_generation(task: SuiteTask, max_gen_toks: int | None, context: int | None) -> None:
    """A generation task must leave room for its prompt in the model's context (lm-eval asserts it mid-run)."""
    if task.config.get("output_type") != "generate_until" or not context:
        return
    own = (task.config.get("generation_kwargs") or {}).get("max_gen_toks")
    budget = max_gen_toks or own or LM_EVAL_MAX_GEN_TOKS
    if budget >= context:
        where = "max_gen_toks" if max_gen_toks else ("the task's max_gen_toks" if own else "lm-eval's default")
        raise RecipeError(f"task '{task.name}' generates up to {budget} new tokens ({where}) but the model's context "
                          f"is {context} tokens: set max_gen_toks below {context} (e.g. --set max_gen_toks={context // 4})")


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from smolforge.table import render_table as table

    from .backends import check_endpoint
    from .parity import compare, parity_rows

    target = runs.get(recipe.run)
    if _is_redteam(recipe.suite):
        return _run_redteam(recipe, target)
    if _is_tools(recipe.suite):
        from .tool_use import evaluate_tool_suite, format_result

        result = evaluate_tool_suite(target, recipe.suite, limit=recipe.limit, batch_size=recipe.batch_size,
                                     device=_device(recipe.device))
        print(f"\ntool-use eval of {target.name}")
        print(format_result(result))
        return target
    suite = load_suite(recipe.suite)
    task_names = _selected(recipe, suite)
    order = [recipe.backend] + ([recipe.parity] if recipe.parity else [])
    if "hf" in order:  # HF first: an in-process vLLM engine would stop HF from loading SmolLM3 afterwards
        order.sort(key=lambda b: b != "hf")
    if recipe.endpoint and "endpoint" in order:
        check_endpoint(recipe.endpoint, recipe.served_name or target.name)
    # each vLLM engine or server frees what HF left and sizes itself from the GPU memory free as it starts
    scored = {backend: score(recipe, target, suite, task_names, backend) for backend in order}
    main = scored[recipe.backend]
    _write(target, suite, task_names, recipe, main)
    _print_scores(target, suite, task_names, main, recipe.modes)
    if recipe.parity:
        report = compare(main, scored[recipe.parity])
        report.update({"run": target.name, "suite": suite.name, "limit": recipe.limit,
                       "seconds": {b: scored[b]["seconds"] for b in order}})
        write_json_atomic(target.eval_dir / f"{suite.name}-parity.json", report)
        print(f"\nparity of {recipe.backend} and {recipe.parity} on {target.name}")
        print(table(["task", "metric", recipe.backend, recipe.parity, "difference", "docs differing", ""],
                    parity_rows(report)))
        target.update_metrics({f"parity/{recipe.parity}/agree": float(report["agree"])})
        if not report["agree"]:
            bad = [t for t, info in report["tasks"].items() if not info["ok"]]
            raise RunError(f"parity check failed: {recipe.backend} and {recipe.parity} differ on {', '.join(bad)} "
                           f"(details: {target.eval_dir / (suite.name + '-parity.json')})")
    return target


def _run_redteam(recipe: Recipe, target: Run) -> Run:
    from smolforge.generation.chat import EndpointGenerator

    from .backends import self_served
    from .redteam import evaluate_run, format_table

    options = dict(limit=recipe.limit, max_new_tokens=recipe.max_new_tokens, batch_size=min(recipe.batch_size, 16),
                   device=_device(recipe.device))
    served_name = recipe.served_name or target.name
    if recipe.backend == "endpoint" and recipe.endpoint:
        result = evaluate_run(target, recipe.suite, generate=EndpointGenerator(recipe.endpoint, served_name,
                                                                                max_tokens=recipe.max_new_tokens),
                              **options)
    elif recipe.backend in ("endpoint", "vllm"):
        with self_served(target.model_dir, target.eval_dir, options["device"], served_name=served_name,
                         max_model_len=_max_length(target.model_dir)) as server:
            result = evaluate_run(target, recipe.suite, generate=EndpointGenerator(
                server.url + "/v1", served_name, max_tokens=recipe.max_new_tokens), **options)
    else:
        result = evaluate_run(target, recipe.suite, **options)
    print(f"\nred-team eval of {target.name} on suite {result['suite']} via {recipe.backend}")
    print(format_table(result))
    return target


def score(recipe: Recipe, target: Run, suite: Suite, task_names: list[str], backend: str) -> dict:
    """One scoring of the suite on ``backend``: ``{backend, endpoint, dtype, scores, samples, seconds}``.

    ``endpoint`` without a recipe URL serves the run itself for the duration
    (:func:`~smolforge.evals.backends.self_served`);
    ``dtype`` is what the scoring ran in (None: an endpoint of the recipe's, served as its owner chose).
    """
    from .backends import scoring_dtype, self_served

    started = time.perf_counter()
    device = _device(recipe.device)
    dtype = scoring_dtype(target.model_dir, device)
    common = dict(limit=recipe.limit, batch_size=recipe.batch_size, device=device, backend=backend,
                  num_fewshot=recipe.num_fewshot, modes=recipe.modes, rope_scaling=recipe.rope_scaling,
                  max_gen_toks=recipe.max_gen_toks, dtype=dtype)
    served_name = recipe.served_name or target.name
    endpoint = recipe.endpoint
    if backend == "endpoint" and not endpoint:
        own = [t for t in task_names if suite.tasks[t].kind != "lm_eval"]   # HF's, before the server takes the GPU
        scores, samples = evaluate(target.model_dir, suite, own, served_name=served_name, **common)
        if rest := [t for t in task_names if t not in own]:
            with self_served(target.model_dir, target.eval_dir, device, served_name=served_name,
                             max_model_len=_max_length(target.model_dir, recipe.rope_scaling),
                             rope_scaling=recipe.rope_scaling) as server:
                log.info("eval: serving %s at %s (ready in %.1f s)", target.name, server.url, server.ready_s)
                served = evaluate(target.model_dir, suite, rest, endpoint=server.url + "/v1",
                                  served_name=served_name, **common)
            scores, samples = {**scores, **served[0]}, samples + served[1]
        where = "self-served (smolforge serve)"
    else:
        scores, samples = evaluate(target.model_dir, suite, task_names, endpoint=endpoint,
                                   served_name=served_name, **common)
        where = endpoint if backend == "endpoint" else None
    external = backend == "endpoint" and bool(endpoint)   # served in whatever dtype its owner chose
    return {"backend": backend, "endpoint": where, "dtype": None if external else dtype, "scores": scores,
            "samples": samples, "seconds": round(time.perf_counter() - started, 1)}


def evaluate(model_dir, suite: Suite, task_names: list[str], limit: int | None = None,
             batch_size: int = 32, device: str = "cpu", *, backend: str = "hf", endpoint: str | None = None,
             served_name: str | None = None, num_fewshot: int | None = None, modes: list | None = None,
             rope_scaling: dict | None = None, max_gen_toks: int | None = None,
             dtype: str = "float32") -> tuple[dict, list[dict]]:
    """Scores ``{task: {metric: value, metric_stderr: value}}`` and per-document samples.

    Chat tasks are scored once per entry of ``modes`` (system prompt ``/think`` or ``/no_think``;
    keys from :func:`mode_key`); position-perplexity tasks by HF on this machine, whatever the backend.
    ``dtype``: what every backend scores in (:func:`~smolforge.evals.backends.scoring_dtype`).
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    from smolforge.generation.vllm_memory import vllm_memory_share

    from .backends import make_lm
    from .long_context import load_model, score_task

    modes = list(modes or [])
    scores: dict[str, dict] = {}
    samples: list[dict] = []
    own = [t for t in task_names if suite.tasks[t].kind != "lm_eval"]
    model = None
    if own or (backend == "hf" and rope_scaling):  # before any vLLM engine exists in this process
        from transformers import AutoTokenizer

        model = load_model(model_dir, rope_scaling, device=device, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        for task in own:
            scores[task] = score_task(model, tokenizer, suite.tasks[task].config, limit=limit)
    lm_tasks = [t for t in task_names if suite.tasks[t].kind == "lm_eval"]
    if not lm_tasks:
        return scores, samples
    if backend != "hf":
        model = None   # released before a vLLM engine sizes its share of the GPU from what is free
    lm = make_lm(backend, model_dir, batch_size=batch_size, device=device, endpoint=endpoint,
                 served_name=served_name, max_length=_max_length(model_dir, rope_scaling),
                 model=model, rope_scaling=rope_scaling, dtype=dtype,   # HF: the model loaded above
                 gpu_memory_utilization=vllm_memory_share(model_dir, device) if backend == "vllm" else None)
    manager = _task_manager(TaskManager)
    rounds = [(False, None)] + [(True, mode) for mode in (modes or [None])]
    for chat, mode in rounds:
        configs = [suite.tasks[t].config for t in lm_tasks if suite.tasks[t].chat == chat]
        if not configs:
            continue
        with _no_environment_report():
            out = lm_eval.simple_evaluate(model=lm, tasks=configs, task_manager=manager, limit=limit,
                                          apply_chat_template=chat, log_samples=True, bootstrap_iters=1000,
                                          num_fewshot=num_fewshot, system_instruction=mode and f"/{mode}",
                                          gen_kwargs={"max_gen_toks": max_gen_toks} if max_gen_toks else None,
                                          random_seed=0, numpy_random_seed=0, torch_random_seed=0)
        several = {}   # tasks scored under more than one filter (gsm8k: strict-match, flexible-extract)
        for task, values in out["results"].items():
            several[task] = len({k.split(",", 1)[1] for k in values if "," in k}) > 1
            scores[mode_key(task, mode, modes) if chat else task] = {
                score_name(k, several[task]): v for k, v in values.items() if "," in k and isinstance(v, (int, float))}
        for task, docs in out.get("samples", {}).items():
            for doc in docs:
                samples.append({"task": mode_key(task, mode, modes) if chat else task,
                                "doc_id": doc.get("doc_id"), "target": doc.get("target"),
                                **({"filter": doc.get("filter")} if several.get(task) else {}),
                                "arguments": [list(map(str, a)) for a in doc.get("arguments", [])],
                                "resps": doc.get("filtered_resps"),
                                "scores": {m: float(doc[m]) for m in doc.get("metrics", [])   # per item: paired gates
                                           if isinstance(doc.get(m), (int, float))},
                                **({"raw": doc.get("resps")} if doc.get("resps") != doc.get("filtered_resps") else {})})
    return scores, samples


@functools.lru_cache(maxsize=1)
def _task_manager(factory):
    """lm-eval's task manager, without indexing lm-eval's ~10,000 bundled task files (≈6 s a process).

    Every suite task reaches lm-eval as a full config (``smolforge.evals.suite`` resolves ``include:``
    and ``!function`` when it loads the YAML, staged standard tasks included), so nothing is looked
    up by name.
    """
    return factory(include_defaults=False)


@contextlib.contextmanager
def _no_environment_report():
    """lm-eval ends every ``simple_evaluate`` with torch's environment report, which shells out to pip,
    nvidia-smi and lscpu (0.35 s a call in a warm process, 2 s in a fresh one; two calls per eval).
    The run already records its package versions (run.json ``versions``) and drops that report."""
    from lm_eval import evaluator

    report = evaluator.add_env_info
    evaluator.add_env_info = lambda results: None
    try:
        yield
    finally:
        evaluator.add_env_info = report


def score_name(key: str, by_filter: bool) -> str:
    """A score's name from lm-eval's ``metric,filter`` key: the metric alone, or ``metric,filter`` where a
    task is scored under several filters (``_stderr`` stays last).

    >>> score_name("acc_stderr,none", False), score_name("exact_match,strict-match", True)
    ('acc_stderr', 'exact_match,strict-match')
    >>> score_name("exact_match_stderr,flexible-extract", True)
    'exact_match,flexible-extract_stderr'
    """
    metric, _, name = key.partition(",")
    if not by_filter:
        return metric
    stderr = metric.endswith("_stderr")
    return f"{metric.removesuffix('_stderr')},{name}" + ("_stderr" if stderr else "")


def mode_key(task: str, mode: str | None, modes: list) -> str:
    """Where a chat task's scores go: the first mode keeps the task's name, later ones add ``@mode``.

    >>> mode_key("instruct", "no_think", ["think", "no_think"]), mode_key("instruct", "think", ["think", "no_think"])
    ('instruct@no_think', 'instruct')
    """
    return task if not modes or mode is None or mode == modes[0] else f"{task}@{mode}"


def base_task(key: str) -> str:
    return key.split("@", 1)[0]


def _write(target: Run, suite: Suite, task_names: list[str], recipe: Recipe, scored: dict) -> None:
    scores = scored["scores"]
    result = {"suite": suite.name, "suite_path": str(suite.path), "run": target.name, "seconds": scored["seconds"],
              "limit": recipe.limit, "backend": scored["backend"], "endpoint": scored["endpoint"],
              "settings": {"chat_template": _chat_template_hash(target.model_dir), "num_fewshot": recipe.num_fewshot,
                           "fewshot_as_multiturn": False, "greedy": True, "dtype": scored["dtype"],
                           "modes": recipe.modes, "rope_scaling": recipe.rope_scaling or None,
                           "max_gen_toks": recipe.max_gen_toks},
              "tasks": {key: {"scores": scores.get(key, {}), "primary": suite.tasks[t].primary,
                              "chat": suite.tasks[t].chat, "apply_chat_template": suite.tasks[t].chat,
                              "mode": _mode_of(key, suite.tasks[t].chat, recipe.modes),
                              "num_fewshot": recipe.num_fewshot if recipe.num_fewshot is not None
                              else suite.tasks[t].config.get("num_fewshot", 0),
                              "kind": suite.tasks[t].kind,
                              "random_baseline": suite.tasks[t].random_baseline, "documents": suite.tasks[t].size}
                        for key in _keys(suite, task_names, recipe.modes) for t in [base_task(key)]}}
    target.eval_dir.mkdir(exist_ok=True)
    write_json_atomic(target.eval_dir / f"{suite.name}.json", result)
    with atomic_writer(target.eval_dir / f"{suite.name}-samples.jsonl") as handle:
        handle.writelines(json.dumps(s, default=str) + "\n" for s in scored["samples"])
    target.update_metrics({**_metrics_for_run(suite, scores), "eval/seconds": scored["seconds"]})


def _metrics_for_run(suite: Suite, scores: dict) -> dict:
    flat = {}
    for task, values in scores.items():
        spec = suite.tasks[base_task(task)]
        for metric, value in values.items():
            if metric.endswith("_stderr"):
                if value not in ("N/A", None):
                    flat[f"{task}/{metric.removesuffix('_stderr')}/stderr"] = value
            else:
                flat[f"{task}/{metric}"] = value
        if spec.random_baseline is not None:
            flat[f"{task}/{spec.primary}/random"] = spec.random_baseline
    return flat


def _chat_template_hash(model_dir) -> str | None:
    import hashlib

    for name in ("chat_template.jinja", "tokenizer_config.json"):
        path = model_dir / name
        if path.is_file():
            text = path.read_text()
            if name.endswith(".json"):
                text = json.loads(text).get("chat_template") or ""
            if text:
                return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return None


def _mode_of(key: str, chat: bool, modes: list) -> str | None:
    """The reasoning mode a score key was scored in (None: a text task, or no modes asked)."""
    return key.partition("@")[2] or (modes[0] if modes and chat else None)


def _keys(suite: Suite, task_names: list[str], modes: list) -> list[str]:
    """Score keys in print order: each task, then its other modes."""
    return [mode_key(t, m, modes) for t in task_names
            for m in (modes if modes and suite.tasks[t].chat else [None])]


def _print_scores(target: Run, suite: Suite, task_names: list[str], scored: dict, modes: list) -> None:
    scores = scored["scores"]
    rows = []
    for key in _keys(suite, task_names, modes):
        spec = suite.tasks[base_task(key)]
        value = scores.get(key, {}).get(spec.primary)
        stderr = scores.get(key, {}).get(f"{spec.primary}_stderr")
        rows.append([key, spec.primary, "n/a" if value is None else f"{value:.3f}",
                     f"{stderr:.3f}" if isinstance(stderr, (int, float)) else "",
                     "-" if spec.random_baseline is None else f"{spec.random_baseline:.3f}",
                     "chat" if spec.chat else "text"])
    print(f"\neval of {target.name} on suite {suite.name} via {scored['backend']} ({scored['seconds']} s)")
    print(render_table(["task", "metric", "score", "stderr", "random", "format"], rows))


def _device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def _max_length(model_dir, rope_scaling: dict | None = None) -> int | None:
    """The longest context to score: the model's, or the stretched one under ``rope_scaling``."""
    if rope_scaling:
        return rope_overrides(model_dir, rope_scaling)["max_position_embeddings"]
    return json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")


def _is_tools(ref: str) -> bool:
    from .tool_use import is_tool_suite

    return is_tool_suite(ref)


def _is_redteam(ref: str) -> bool:
    from .redteam import is_redteam_suite

    try:
        return is_redteam_suite(ref)
    except Exception:  # noqa: BLE001 - not a red-team suite folder; load_suite reports what it is
        return False
