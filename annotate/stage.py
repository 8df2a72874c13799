"""Human preference review as a stage: push model outputs to Argilla, pull verdicts as preference data.

    smolforge annotate serve                                    # the embedded Argilla, until Ctrl-C
    smolforge annotate push --config recipes/demo/annotate.yaml # generate k responses, push records
    smolforge annotate status --config recipes/demo/annotate.yaml  # records done, answers per annotator
    smolforge annotate pull --config recipes/demo/annotate.yaml # submitted answers → a preference run
    smolforge annotate --config recipes/demo/annotate.yaml      # the pipeline step: push, wait, pull

**Push** reads prompts (a ``.jsonl``, a data run's prompts, or ``suite:NAME[/TASK]``), samples
``k`` responses per prompt from one run (``runs: [sft-demo]``) or alternately from two
(``runs: [sft-demo, dpo-demo]``: an A/B review), and creates or extends the Argilla dataset
``dataset`` (:mod:`smolforge.annotate.records`: prompt, responses, an A/B/tie or ranking question, optional
rating and comment, run ids and sampling settings as metadata, guidelines, ``annotators`` per
record). Record ids are stable, so pushing again adds no duplicates. **Pull** turns the
submitted answers into ``prompt/chosen/rejected`` rows by the rule in :mod:`smolforge.annotate.pull`, writes
them as run ``name`` (``data/prefs/``, which a ``dpo`` step reads with ``data: <name>``) with
``annotations.json`` (counts of used, tied, disagreed, discarded and pending records, and
inter-annotator agreement), and prints the counts.

The server: ``url:`` (with ``$ARGILLA_API_KEY``) for a team's Argilla; otherwise the embedded one
for ``home`` (default ``<runs>/.argilla``) — the one ``smolforge annotate serve`` runs, or one
started for the length of the command. The pipeline step waits up to ``wait`` seconds for every
record to have ``annotators`` submitted answers, then pulls what is there. ``scripted:`` (demo
and tests) lets verifier-driven annotator users answer through the SDK (:mod:`smolforge.annotate.scripted`).

Everything that can be checked before generating is checked first: the runs and prompts, the
server (reachable, key accepted) and an existing dataset's schema.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smolforge.recipe import FRACTION
from smolforge.errors import RecipeError, RunError
from smolforge.runs import Run, Runs, utc_now

from .generate import SAMPLING_DEFAULTS, response_runs
from .prompts import load_prompts
from .push import MAX_CHARS
from .review import Review

log = logging.getLogger(__name__)
for _chatty in ("argilla.sdk", "httpx"):  # one line per SDK call or HTTP request otherwise
    logging.getLogger(_chatty).setLevel(logging.WARNING)

GENERATION = ("auto", "hf", "vllm")


@dataclass
class Sampling:
    temperature: float = SAMPLING_DEFAULTS["temperature"]        # 0 = greedy (needs two runs)
    top_p: float = field(default=SAMPLING_DEFAULTS["top_p"], metadata=FRACTION)                 # nucleus sampling
    max_new_tokens: int = SAMPLING_DEFAULTS["max_new_tokens"]    # response length cap
    seed: int = SAMPLING_DEFAULTS["seed"]                        # same seed, same responses (HF)


@dataclass
class Scripted:
    annotators: int = 2               # users scripted-1..N answer every record through the SDK
    noise: float = field(default=0.0, metadata=FRACTION)               # each answers something else at this rate (agreement < 1)
    seed: int = 0                     # seeds the noise


@dataclass
class Recipe:
    name: str = "annotate-demo"       # the preference run the pull writes (a dpo step's data:)
    runs: list = field(default_factory=lambda: ["sft-demo"])   # 1 or 2 runs whose model/ writes the responses
    prompts: str = "data-demo"        # a .jsonl, a data run (its data/prompts/), or suite:NAME[/TASK]
    limit: int | None = 64            # the first N prompts (None = all)
    k: int = 2                        # responses per prompt (2: A/B/tie; more: a ranking)
    sampling: Sampling = field(default_factory=Sampling)
    generation: str = "auto"          # auto | hf | vllm (a vLLM server on the run's model)
    dataset: str = "review-demo"      # Argilla dataset to create or extend
    workspace: str = "argilla"        # Argilla workspace
    url: str | None = None            # a team's Argilla (key: $ARGILLA_API_KEY); unset: the embedded one
    home: str | None = None           # embedded server's folder (default <runs>/.argilla)
    annotators: int = 1               # submitted answers wanted per record (Argilla's task distribution)
    min_votes: int | None = None      # submitted answers a record needs to be pulled (default: annotators)
    rating: bool = False              # also ask a 1-5 rating of the best response
    comment: bool = True              # an optional free-text comment
    guidelines: str | None = None     # annotation guidelines (text, or a .md file); default: smolforge.annotate.records
    wait: float = 0.0                 # pipeline step: seconds to wait for every record to be answered
    poll: float = 10.0                # seconds between progress checks while waiting
    scripted: Scripted | None = None  # demo/tests: scripted annotators answer after the push
    review: Review | None = None      # an LLM judge reads every pair first: send all (its verdict hidden) or only
                                      #   the pairs it is unsure of to people (smolforge.annotate.review)
    max_chars: int = MAX_CHARS        # longest prompt or response to push (200k); longer stops the push, named


def _guidelines(recipe: Recipe) -> str:
    from .records import GUIDELINES

    text = recipe.guidelines
    if text is None:
        return GUIDELINES
    if text.endswith(".md") or (len(text) < 256 and Path(text).is_file()):
        if not Path(text).is_file():
            raise RecipeError(f"guidelines: {text} not found")
        return Path(text).read_text(encoding="utf-8")
    return text


def _conversational(rows: list[dict], source: str) -> bool:
    kinds = {isinstance(row["prompt"], list) for row in rows}
    if len(kinds) > 1:
        raise RecipeError(f"prompts: {source} mixes plain-text and chat prompts; a review dataset holds one kind")
    return kinds.pop()


def schema_for(recipe: Recipe, conversational: bool) -> dict:
    from .records import review_schema

    from .review import METADATA

    schema = review_schema(recipe.k, conversational=conversational, rating=recipe.rating, comment=recipe.comment,
                           guidelines=_guidelines(recipe), min_submitted=recipe.annotators,
                           sampling=dataclasses.asdict(recipe.sampling))
    if recipe.review is not None:
        schema["metadata"] |= METADATA     # hidden from annotators, as the run ids are
    return schema


def check_recipe(recipe: Recipe) -> None:
    """The checks that need neither runs nor a server."""
    if not 1 <= len(recipe.runs) <= 2 or len(set(recipe.runs)) != len(recipe.runs):
        raise RecipeError(f"runs: one run, or two different runs, to sample responses from; got {recipe.runs}")
    if recipe.k < 2:
        raise RecipeError(f"k must be at least 2 (responses to compare per prompt), got {recipe.k}")
    if recipe.k < len(recipe.runs):
        raise RecipeError(f"k={recipe.k} is fewer than the {len(recipe.runs)} runs to compare")
    if recipe.sampling.temperature < 0 or not 0 < recipe.sampling.top_p <= 1 or recipe.sampling.max_new_tokens < 1:
        raise RecipeError("sampling: temperature >= 0, 0 < top_p <= 1 and max_new_tokens >= 1 are needed, got "
                          f"{dataclasses.asdict(recipe.sampling)}")
    if recipe.sampling.temperature == 0 and len(recipe.runs) == 1:
        raise RecipeError("sampling.temperature 0 (greedy) with one run gives k identical responses; "
                          "sample (temperature > 0) or compare two runs")
    if recipe.generation not in GENERATION:
        raise RecipeError(f"generation must be one of {', '.join(GENERATION)}, got {recipe.generation!r}")
    if recipe.annotators < 1 or (recipe.min_votes is not None and recipe.min_votes < 1):
        raise RecipeError("annotators and min_votes must be at least 1")
    if recipe.max_chars < 1:
        raise RecipeError(f"max_chars must be at least 1, got {recipe.max_chars}")
    if recipe.wait < 0 or recipe.poll <= 0:
        raise RecipeError(f"wait must be >= 0 and poll > 0 seconds, got wait={recipe.wait}, poll={recipe.poll}")
    if recipe.scripted is not None and not (recipe.scripted.annotators >= 1 and 0 <= recipe.scripted.noise <= 1):
        raise RecipeError("scripted: annotators >= 1 and 0 <= noise <= 1 are needed")
    if recipe.url is not None and not recipe.url.startswith(("http://", "https://")):
        raise RecipeError(f"url must start with http:// or https://, got {recipe.url!r}")
    if recipe.url is not None and not os.environ.get("ARGILLA_API_KEY"):
        raise RecipeError(f"url: {recipe.url} needs $ARGILLA_API_KEY (an owner's or admin's API key)")
    if recipe.review is not None:
        from .review import check

        check(recipe.review, recipe.k)


def validate(recipe: Recipe, runs: Runs) -> None:
    """Recipe values, the runs' models and the prompts; the server is checked when the step starts."""
    from .server import argilla_python

    check_recipe(recipe)
    for name in recipe.runs:
        if not (runs.get(name).model_dir / "config.json").is_file():
            raise RecipeError(f"runs: '{name}' has no model/ to sample responses from")
    rows, _ = load_prompts(recipe.prompts, runs, recipe.limit)
    _conversational(rows, recipe.prompts)
    _guidelines(recipe)
    if recipe.url is None:
        argilla_python()  # the embedded server must be installed
    if recipe.review is not None and recipe.review.judge.get("run"):
        if not (runs.get(recipe.review.judge["run"]).model_dir / "config.json").is_file():
            raise RecipeError(f"review.judge.run: '{recipe.review.judge['run']}' has no model/ to judge with")
    elif recipe.review is not None:
        from .review import judge_endpoint

        judge_endpoint(recipe.review, None)   # the judge answers and serves its model, before any sampling


def home_of(recipe: Recipe, runs: Runs) -> Path:
    return Path(recipe.home).expanduser() if recipe.home else runs.root / ".argilla"


@contextlib.contextmanager
def argilla(recipe: Recipe, runs: Runs) -> Iterator[tuple[str, str]]:
    """``(url, api_key)`` of the server to use; an embedded one is started (and stopped) when none runs."""
    from .server import ArgillaServer, owner_api_key, running_url

    if recipe.url is not None:
        yield recipe.url.rstrip("/"), os.environ["ARGILLA_API_KEY"]
        return
    home = home_of(recipe, runs)
    url = running_url(home)
    if url is not None:
        log.info("annotate: using the Argilla server at %s (%s)", url, home)
        yield url, owner_api_key(home)
        return
    print(f"starting the embedded Argilla server in {home} …", file=sys.stderr, flush=True)
    with ArgillaServer(home) as server:
        print(f"Argilla at {server.url} (ready in {server.ready_s:.1f} s)", file=sys.stderr, flush=True)
        yield server.url, server.api_key


def push(recipe: Recipe, runs: Runs, url: str, api_key: str) -> tuple[dict, dict[str, str]]:
    """Generate and push; ``(summary, {record id: reference answer})``. The schema is checked first."""
    from .generate import generate_responses
    from .push import find_dataset, push_records
    from .records import build_record, check_schema, schema_of
    from .server import connect

    rows, _ = load_prompts(recipe.prompts, runs, recipe.limit)
    schema = schema_for(recipe, _conversational(rows, recipe.prompts))
    client = connect(url, api_key)
    existing = find_dataset(client, recipe.dataset, recipe.workspace)
    if existing is not None:
        check_schema(schema_of(existing.settings), schema)  # before spending time on generation
    model_dirs = {name: runs.get(name).model_dir for name in recipe.runs}
    backend = _backend(recipe, model_dirs)
    started = time.perf_counter()
    sampling = dataclasses.asdict(recipe.sampling)
    responses = generate_responses(model_dirs, [row["prompt"] for row in rows], recipe.k, sampling, backend=backend)
    generated_s = time.perf_counter() - started
    print(f"sampled {recipe.k} responses for each of {len(rows)} prompts with {backend} in {generated_s:.1f} s",
          flush=True)
    items = [build_record(row["prompt"], texts, response_runs(recipe.runs, recipe.k), sampling)
             for row, texts in zip(rows, responses)]
    answers = {item["id"]: row["answer"] for item, row in zip(items, rows) if "answer" in row}
    routed = _judge_first(recipe, runs, items, answers) if recipe.review is not None else None
    to_push = [item for item in items if routed is None or routed[item["id"]] != "accepted"]
    if to_push:
        summary = push_records(client, recipe.dataset, recipe.workspace, schema, to_push, max_chars=recipe.max_chars)
    else:   # the judge settled every pair and no audit was asked for: people have nothing to see, and the
            # (empty) dataset still exists for the pull
        from .push import ensure_dataset

        dataset, _ = ensure_dataset(client, recipe.dataset, recipe.workspace, schema)
        summary = {"dataset": recipe.dataset, "workspace": recipe.workspace, "records": 0, "new": 0, "updated": 0,
                   "total": int(dataset.progress()["total"])}
    summary |= {"prompts": len(rows), "k": recipe.k, "runs": list(recipe.runs), "generation": backend,
                "generation_s": round(generated_s, 2), "url": url}
    if routed is not None:
        from collections import Counter

        summary["review"] = dict(Counter(routed.values()))
        print(f"the judge read {len(items)} pairs: {len(to_push)} go to people "
              f"({', '.join(f'{n} {where}' for where, n in sorted(summary['review'].items()))})", flush=True)
    print(f"pushed {summary['records']} records to {recipe.workspace}/{recipe.dataset} at {url} "
          f"({summary['new']} new, {summary['updated']} updated; {summary['total']} in the dataset)", flush=True)
    return summary, answers


def review_store(recipe: Recipe, runs: Runs) -> Path:
    """Where the judge's reading of this recipe's dataset is kept (:func:`smolforge.annotate.review.store_path`)."""
    from .review import store_path

    server = recipe.url.rstrip("/") if recipe.url else str(home_of(recipe, runs).resolve())
    return store_path(runs.cache_dir("review"), server, recipe.workspace, recipe.dataset)


def _judge_first(recipe: Recipe, runs: Runs, items: list[dict], answers: dict[str, str]) -> dict[str, str]:
    """Judge every pair, route it (:func:`smolforge.annotate.review.route`), put the verdict into the
    record's hidden metadata and keep it in :func:`review_store`; ``{record id: route}``."""
    from .review import judge_items, metadata, route, save, served_judge

    log_path = runs.cache_dir("review") / f"{recipe.dataset}-judge-vllm.log"
    with served_judge(recipe.review, runs, log_path) as judge:
        started = time.perf_counter()
        judged = judge_items(judge, items, answers, recipe.review)
    routes = route(judged, recipe.review)
    for item in items:
        item["metadata"] |= metadata(judged[item["id"]], routes[item["id"]])
    save(review_store(recipe, runs), {
        item["id"]: {**judged[item["id"]], "route": routes[item["id"]], "judge": judge.identity,
                     "prompt": item["fields"]["prompt"], "responses": [item["fields"]["response_1"],
                                                                       item["fields"]["response_2"]]}
        for item in items})
    print(f"judged {len(items)} pairs with {judge.identity} in {time.perf_counter() - started:.1f} s "
          f"({judge.asked} requests, {judge.cached} cached)", flush=True)
    return routes


def _backend(recipe: Recipe, model_dirs: dict[str, Path]) -> str:
    from smolforge.generation.backends import pick_backend

    if recipe.generation == "hf":
        return "hf"
    choices = {pick_backend(recipe.generation, path, accepts=("vllm-server",)) for path in model_dirs.values()}
    return "hf" if "hf" in choices else choices.pop()


def answer_scripted(recipe: Recipe, url: str, api_key: str, answers: dict[str, str]) -> list[dict]:
    from .scripted import answer_all, records_to_answer, scripted_users, verifier

    if not answers:
        raise RecipeError(f"scripted annotators judge against reference answers; prompts {recipe.prompts} have none "
                          "(rows need an 'answer')")
    done = []
    records = records_to_answer(url, api_key, recipe.dataset, recipe.workspace)
    for username, key in scripted_users(url, api_key, recipe.workspace, recipe.scripted.annotators):
        decide = verifier(answers, noise=recipe.scripted.noise, seed=recipe.scripted.seed)
        counts = answer_all(url, key, records, decide)
        done.append({"user": username, **counts})
        print(f"scripted annotator {username}: {counts['submitted']} submitted, {counts['discarded']} discarded",
              flush=True)
    return done


def wait_for_answers(recipe: Recipe, url: str, api_key: str) -> dict:
    """Poll the dataset's progress until every record is completed or ``wait`` seconds have passed."""
    from .push import open_dataset

    dataset = open_dataset(url, api_key, recipe.dataset, recipe.workspace)
    deadline = time.monotonic() + recipe.wait
    while True:
        progress = dataset.progress()
        if progress["completed"] >= progress["total"] or time.monotonic() >= deadline:
            return {key: progress[key] for key in ("total", "completed", "pending")}
        print(f"waiting for annotators: {progress['completed']}/{progress['total']} records completed "
              f"({max(0, deadline - time.monotonic()):.0f} s left)", flush=True)
        time.sleep(min(recipe.poll, max(0.1, deadline - time.monotonic())))


def fetch(recipe: Recipe, url: str, api_key: str) -> list[dict]:
    """Every record of the dataset with its responses, as :func:`smolforge.annotate.pull.resolve` reads them."""
    from .pull import from_argilla
    from .push import open_dataset

    dataset = open_dataset(url, api_key, recipe.dataset, recipe.workspace)
    return [from_argilla(record) for record in dataset.records(with_responses=True)]


def pull(recipe: Recipe, runs: Runs, url: str, api_key: str, *, overwrite: bool = False,
         extra_report: dict | None = None, started_at: str | None = None) -> Run:
    """Resolve the submitted answers and write the preference run ``recipe.name``."""
    from smolforge.recipe import to_dict

    from .pull import resolve, write_preference_run

    started = time.perf_counter()
    records = fetch(recipe, url, api_key)
    fetched_s = time.perf_counter() - started
    min_votes = recipe.min_votes or recipe.annotators
    rows, report = resolve(records, min_votes=min_votes)
    if recipe.review is not None:
        from .review import load, merge

        entries = load(review_store(recipe, runs))
        if not entries:
            raise RecipeError(f"review: no judged pairs kept for {recipe.workspace}/{recipe.dataset} "
                              f"({review_store(recipe, runs)}); push with this review: first")
        rows, report = merge(rows, report, records, entries, min_votes)
    report |= {"dataset": recipe.dataset, "workspace": recipe.workspace, "url": url,
               "pull_s": round(fetched_s, 2)} | (extra_report or {})
    parents: list[Any] = [runs.get(name) for name in recipe.runs if _exists(runs, name)]
    with contextlib.suppress(Exception):  # best effort: the prompts may be gone since the push
        _, data_run = load_prompts(recipe.prompts, runs, recipe.limit)
        if data_run is not None:
            parents.append(data_run)
    return write_preference_run(runs, recipe.name, rows, report, parents, recipe=to_dict(recipe),
                                overwrite=overwrite, started_at=started_at)


def _exists(runs: Runs, name: str) -> bool:
    try:
        runs.get(name)
    except Exception:  # noqa: BLE001 - a generating run deleted since the push is not a parent
        return False
    return True


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    """The pipeline step: push, scripted answers (if any), wait, pull."""
    if runs.exists(recipe.name) and not overwrite:  # before minutes of generation
        raise RunError(f"run '{recipe.name}' already exists at {runs.root / recipe.name}; "
                       "pass --overwrite or choose another name")
    started_at = utc_now()
    with argilla(recipe, runs) as (url, api_key):
        pushed, answers = push(recipe, runs, url, api_key)
        extra: dict[str, Any] = {"push": pushed}
        if recipe.scripted is not None:
            extra["scripted"] = answer_scripted(recipe, url, api_key, answers)
        if recipe.wait > 0:
            extra["waited"] = wait_for_answers(recipe, url, api_key)
        return pull(recipe, runs, url, api_key, overwrite=overwrite, extra_report=extra, started_at=started_at)


def push_only(recipe: Recipe, runs: Runs) -> dict:
    """``smolforge annotate push``: generate and push, nothing else."""
    validate(recipe, runs)
    with argilla(recipe, runs) as (url, api_key):
        return push(recipe, runs, url, api_key)[0]


def pull_only(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    """``smolforge annotate pull``: what is submitted now becomes the preference run."""
    check_recipe(recipe)
    with argilla(recipe, runs) as (url, api_key):
        return pull(recipe, runs, url, api_key, overwrite=overwrite)


def progress_table(recipe: Recipe, url: str, api_key: str) -> str:
    """The dataset's progress: records complete/pending, and each annotator's submitted, draft and
    discarded answers (``smolforge annotate status``)."""
    from smolforge.table import render_table

    from .push import open_dataset

    dataset = open_dataset(url, api_key, recipe.dataset, recipe.workspace)
    progress = dataset.progress(with_users_distribution=True)
    rows = []
    for user, done in sorted((progress.get("users") or {}).items()):
        totals = {status: sum((done.get(part) or {}).get(status, 0) for part in ("completed", "pending"))
                  for status in ("submitted", "draft", "discarded")}
        rows.append([user, totals["submitted"], totals["draft"], totals["discarded"]])
    head = (f"{recipe.workspace}/{recipe.dataset} at {url}: {progress['completed']} of {progress['total']} "
            f"records complete ({recipe.annotators} submitted answers each), {progress['pending']} pending")
    return head + ("\n" + render_table(["annotator", "submitted", "draft", "discarded"], rows) if rows else
                   "\nno answers yet")


def status_only(recipe: Recipe, runs: Runs) -> str:
    """``smolforge annotate status``."""
    check_recipe(recipe)
    with argilla(recipe, runs) as (url, api_key):
        return progress_table(recipe, url, api_key)


def summary(run_: Run) -> str:
    """The counts and agreement of a pulled preference run, for the CLI."""
    import json

    report = json.loads(run_.annotations_path.read_text())
    counts = ", ".join(f"{key} {value}" for key, value in report["counts"].items())
    agree = report.get("agreement") or {}
    value = agree.get("value")
    agreement = f"{agree.get('metric')} {value:.3f}" if value is not None else "agreement undefined"
    line = (f"{report['records']} records: {counts}; {agree.get('annotators', 0)} annotators, {agreement}; "
            f"{run_.metrics.get('annotate/rows')} preference pairs in {run_.data_shard_dir('prefs')}")
    review = report.get("review")
    if review:
        judged = review["judge_vs_people"]
        line += (f"\njudge: {review['pairs']} pairs, {review['sent_to_people']} sent to people ({review['uncertain']} "
                 f"uncertain, {review['audit']} audit), {review['accepted']} accepted ({review['accepted_rows']} pairs); "
                 f"against the people: kappa {judged['kappa']}, accuracy {judged['accuracy']} on {judged['items']}, "
                 f"audit agreement {review['audit_agreement']['accuracy']} on {review['audit_agreement']['items']}")
    return line
