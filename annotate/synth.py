"""Synthetic data with AI feedback: prompts answered k times by one or more generators, each answer graded
by an LLM judge, kept as SFT rows (the best answer) and preference pairs (best over worst).

    smolforge synth --config synth.yaml
    smolforge synth --config synth.yaml --set k=4 --set min_margin=0.25

Generators and the judge are OpenAI-compatible endpoints (``smolforge serve``, vLLM, a hosted API with its
key in the environment variable ``api_key_env`` names). Each prompt of ``prompts`` (JSON Lines of
``{"prompt": text or messages}``) is sampled ``k`` times from every generator (one request with
``n: k``, ``temperature``), every answer is graded on ``rubric`` by the judge
(:mod:`smolforge.generation.judge`: cached, rate-limited) and scaled to [0, 1]. Per prompt the best
graded answer becomes an SFT row, and best over worst a preference pair when their grades differ by
more than ``min_margin``. The rows are checked with the data stage's schemas and written as the run's
``data/sft/`` and ``data/prefs/`` shards: ``smolforge sft``/``dpo`` take the run as ``data:``, and a data
recipe can list the shards as sources to pass them through its filters, dedup and decontamination.
``candidates.jsonl`` keeps every answer with its generator, grade and the judge's reason; ``run.json``
names the generators, the judge and the prompts' and rubric's fingerprints (lineage of every row).

    >>> best_and_worst([{"text": "a", "score": 0.25}, {"text": "b", "score": 1.0}, {"text": "c", "score": None}])
    ({'text': 'b', 'score': 1.0}, {'text': 'a', 'score': 0.25})
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from smolforge.errors import RecipeError, ServiceError
from smolforge.generation.judge.endpoint import JudgeEndpoint, cache_for
from smolforge.generation.judge.prompts import load_rubric, parse_score, pointwise_messages, render
from smolforge.recipe import to_dict
from smolforge.runs import Run, Runs, atomic_writer, fingerprint

__all__ = ["Recipe", "validate", "run", "best_and_worst", "rows_for_prompt"]


@dataclass
class Endpoint:
    endpoint: str | None = None       # OpenAI-compatible base URL (http://127.0.0.1:8000/v1)
    model: str | None = None          # the served model's name (default: the endpoint's only model)
    api_key_env: str | None = None    # environment variable holding the key (never logged)


@dataclass
class Recipe:
    name: str = "synth-demo"          # run name
    prompts: str = ""                 # .jsonl of {"prompt": text or [{"role", "content"}, ...]}
    generators: list = field(default_factory=list)  # [{endpoint, model, api_key_env}]: each answers every prompt k times
    k: int = 4                        # answers per prompt and generator
    temperature: float = 0.8          # sampling temperature of the generators
    max_tokens: int = 128             # answer length
    judge: Endpoint = field(default_factory=Endpoint)  # grades every answer on the rubric
    rubric: str = ""                  # rubric YAML (name, scale, criteria)
    judge_max_tokens: int = 64        # the judge's reply ("Score: N" and a reason)
    min_margin: float = 0.0           # a pair only where best − worst grade (on [0, 1]) exceeds this
    limit: int | None = None          # the first N prompts only
    workers: int = 4                  # requests in flight
    rate: float = 0.0                 # judge requests per second at most (0: no limit)
    timeout: float = 120.0            # seconds per request


def _generators(recipe: Recipe) -> list[Endpoint]:
    out = []
    for i, spec in enumerate(recipe.generators):
        if not isinstance(spec, dict) or not spec.get("endpoint"):
            raise RecipeError(f"generators[{i}]: expected {{endpoint: URL, model: NAME}}, got {spec!r}")
        unknown = sorted(set(spec) - {"endpoint", "model", "api_key_env"})
        if unknown:
            raise RecipeError(f"generators[{i}]: unknown field(s) {', '.join(unknown)}")
        out.append(Endpoint(**spec))
    if not out:
        raise RecipeError("generators: name at least one endpoint ({endpoint: URL, model: NAME})")
    return out


def _read_prompts(path: str, limit: int | None) -> list:
    from smolforge.data.jsonl import read_jsonl
    from smolforge.data.schemas import validate_row

    prompts = []
    for line, row in read_jsonl(path):
        validate_row(row, "prompt", f"{path} line {line}")
        prompts.append(row["prompt"])
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise RecipeError(f"prompts: {path} holds no prompts")
    return prompts


def _judge(recipe: Recipe, cache_dir=None) -> JudgeEndpoint:
    judge = JudgeEndpoint(recipe.judge.endpoint, recipe.judge.model or "", api_key_env=recipe.judge.api_key_env,
                          workers=recipe.workers, rate=recipe.rate, timeout=recipe.timeout, progress=True)
    judge.check_model("judge.model")
    if cache_dir is not None:
        judge.cache = cache_for(cache_dir, judge.identity)
    return judge


def _generator_client(spec: Endpoint, recipe: Recipe, index: int) -> JudgeEndpoint:
    """The generator's endpoint (its model checked as a judge's is)."""
    endpoint = JudgeEndpoint(spec.endpoint, spec.model or "", api_key_env=spec.api_key_env, timeout=recipe.timeout)
    endpoint.check_model(f"generators[{index}].model")
    return endpoint


def validate(recipe: Recipe, runs: Runs) -> None:
    if not recipe.prompts:
        raise RecipeError("prompts: name a .jsonl of {\"prompt\": …} rows")
    for name, value in (("k", recipe.k), ("max_tokens", recipe.max_tokens), ("judge_max_tokens", recipe.judge_max_tokens),
                        ("workers", recipe.workers)):
        if value < 1:
            raise RecipeError(f"{name} must be >= 1, got {value}")
    if recipe.limit is not None and recipe.limit < 1:
        raise RecipeError(f"limit must be >= 1 or null, got {recipe.limit}")
    if not 0.0 <= recipe.min_margin < 1.0 or recipe.temperature < 0 or recipe.rate < 0:
        raise RecipeError(f"min_margin must be in [0, 1), temperature and rate >= 0; got {recipe.min_margin}, "
                          f"{recipe.temperature}, {recipe.rate}")
    if not recipe.judge.endpoint:
        raise RecipeError("judge: give the judge's endpoint (and model)")
    if not recipe.rubric:
        raise RecipeError("rubric: the judge grades answers on a rubric YAML (name, scale, criteria)")
    load_rubric(recipe.rubric)
    _read_prompts(recipe.prompts, recipe.limit)
    generators = _generators(recipe)
    _judge(recipe)
    for i, spec in enumerate(generators):
        _generator_client(spec, recipe, i)


def _sample(endpoint: JudgeEndpoint, prompts: list, recipe: Recipe) -> list[list[str]]:
    """``k`` answers per prompt from one generator (one request with ``n: k`` each, ``workers`` at a time)."""
    client = endpoint.client      # the endpoint's own (its key, the recipe's timeout, retries)

    def one(prompt) -> list[str]:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        payload = {"model": endpoint.model, "messages": messages, "n": recipe.k, "temperature": recipe.temperature,
                   "max_tokens": recipe.max_tokens}
        reply = client.chat(payload)
        answers = [(c.get("message") or {}).get("content") or "" for c in reply["choices"]]
        if len(answers) != recipe.k:
            raise ServiceError(f"{endpoint.base_url}: {len(answers)} answers for n={recipe.k} (model {endpoint.model})")
        return answers

    with ThreadPoolExecutor(max_workers=recipe.workers) as pool:
        return list(pool.map(one, prompts))


def best_and_worst(candidates: list[dict]) -> tuple[dict | None, dict | None]:
    """The highest- and lowest-graded candidates (the first of equals); (None, None) when none is graded."""
    graded = [c for c in candidates if c["score"] is not None]
    if not graded:
        return None, None
    return max(graded, key=lambda c: c["score"]), min(graded, key=lambda c: c["score"])


def rows_for_prompt(prompt, candidates: list[dict], min_margin: float) -> tuple[dict | None, dict | None]:
    """(the SFT row, the preference pair) of one prompt; either is None where its candidates give none.

    >>> cands = [{"text": "4", "score": 1.0}, {"text": "5", "score": 0.0}]
    >>> rows_for_prompt("2+2?", cands, 0.5)
    ({'messages': [{'role': 'user', 'content': '2+2?'}, {'role': 'assistant', 'content': '4'}]}, {'prompt': '2+2?', 'chosen': '4', 'rejected': '5'})
    >>> rows_for_prompt("2+2?", [{"text": "4", "score": 0.5}, {"text": "5", "score": 0.5}], 0.0)[1] is None
    True
    """
    best, worst = best_and_worst(candidates)
    if best is None:
        return None, None
    conversation = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    sft = {"messages": [*conversation, {"role": "assistant", "content": best["text"]}]}
    if best["score"] - worst["score"] <= min_margin or best["text"] == worst["text"]:
        return sft, None
    if isinstance(prompt, list):
        pair = {"prompt": prompt, "chosen": [{"role": "assistant", "content": best["text"]}],
                "rejected": [{"role": "assistant", "content": worst["text"]}]}
    else:
        pair = {"prompt": prompt, "chosen": best["text"], "rejected": worst["text"]}
    return sft, pair


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from smolforge.data.schemas import validate_row
    from smolforge.data.shards import ShardWriter

    prompts = _read_prompts(recipe.prompts, recipe.limit)
    rubric = load_rubric(recipe.rubric)
    low, high = rubric.scale
    generators = [_generator_client(spec, recipe, i) for i, spec in enumerate(_generators(recipe))]
    judge = _judge(recipe, runs.cache_dir("judge"))
    with runs.start("synth", recipe.name, to_dict(recipe), overwrite=overwrite,
                    data_fingerprints=fingerprint(recipe.prompts, recipe.rubric)) as run:
        started = time.perf_counter()
        candidates = []                        # per prompt: every answer of every generator
        for endpoint in generators:
            for i, answers in enumerate(_sample(endpoint, prompts, recipe)):
                if len(candidates) <= i:
                    candidates.append([])
                candidates[i] += [{"text": a, "generator": endpoint.identity} for a in answers]
        flat = [(i, c) for i, cands in enumerate(candidates) for c in cands]
        chats = [pointwise_messages(prompts[i], c["text"], rubric) for i, c in flat]
        for (i, c), answer in zip(flat, judge.ask(chats, max_tokens=recipe.judge_max_tokens, what="grades")):
            score, reason = parse_score(answer["reply"], rubric)
            c.update(score=None if score is None else (score - low) / (high - low), grade=score, reason=reason)
        sft_rows, pairs = [], []
        for i, (prompt, cands) in enumerate(zip(prompts, candidates)):
            sft, pair = rows_for_prompt(prompt, [c for c in cands if c["text"].strip()], recipe.min_margin)
            for row, kind, schema, out in ((sft, "sft", "chat", sft_rows), (pair, "pair", "preference", pairs)):
                if row is not None:
                    validate_row(row, schema, f"{recipe.name} prompt {i + 1} ({kind})")
                    out.append(row)
        with ShardWriter(run.data_shard_dir("sft")) as writer:
            for row in sft_rows:
                writer.write(row)
        with ShardWriter(run.data_shard_dir("prefs")) as writer:
            for row in pairs:
                writer.write(row)
        with atomic_writer(run.candidates_path) as handle:
            for prompt, cands in zip(prompts, candidates):
                handle.write(json.dumps({"prompt": prompt, "prompt_text": render(prompt), "candidates": cands},
                                        ensure_ascii=False) + "\n")
        graded = [c for _, c in flat if c["score"] is not None]
        margins = [_margin(cands) for cands in candidates]
        margins = [m for m in margins if m is not None]
        run.finish({"synth/prompts": len(prompts), "synth/candidates": len(flat), "synth/graded": len(graded),
                    "synth/sft_rows": len(sft_rows), "synth/pairs": len(pairs),
                    **({"synth/mean_margin": round(sum(margins) / len(margins), 3)} if margins else {}),
                    "synth/judge": judge.identity, "synth/generators": ", ".join(g.identity for g in generators),
                    "synth/judge_requests": judge.asked, "synth/judge_cached": judge.cached,
                    "synth/seconds": round(time.perf_counter() - started, 1)})
    print(f"synth {run.name}: {len(prompts)} prompts, {len(flat)} answers ({len(graded)} graded), "
          f"{len(sft_rows)} SFT rows, {len(pairs)} pairs → {run.data_dir}")
    return run


def _margin(cands: list[dict]) -> float | None:
    best, worst = best_and_worst(cands)
    return None if best is None else best["score"] - worst["score"]
