"""The data stage: raw sources → checked, cleaned, deduplicated, decontaminated, tokenized data.

    smolforge data prepare recipes/demo/data.yaml
    smolforge data prepare recipes/demo/data.yaml --set dedup.workers=2 --json
    smolforge data --config recipes/demo/data.yaml --set world.entities=20      # the same stage

For each kind of data (``pretrain`` text, ``sft`` chat, ``prefs`` preference pairs, ``prompts``
for online RL with the answers verifiers check, ``feedback``: unpaired answers marked good or bad, for KTO)
rows come from the recipe's ``sources:`` (JSONL, Parquet, CSV, text folders, `datasets` datasets; see
:mod:`smolforge.data.sources`) or from the synthetic world of the embedded default: its default kinds
(all but ``feedback``) when the recipe names no sources, else only the kinds ``world.kinds`` lists (the
command says which; other kinds stay empty).
Then, streaming:

1. every row is validated (``on_error: fail`` stops at the first bad row naming file, row and
   field; ``skip`` counts and lists bad rows in ``reports/bad_rows.jsonl``);
2. pretraining text passes Gopher-style quality filters (:mod:`smolforge.data.filters`);
3. dedup: exact (normalised hash) on every kind; MinHash-LSH near-duplicates and repeated
   paragraphs on pretraining text (:mod:`smolforge.data.dedup`);
4. decontamination against every registered eval suite (:mod:`smolforge.data.decontaminate`);
5. shards ``data/<kind>/part-*.jsonl``; a byte-level BPE ``tokenizer/`` trained on the kept text
   (or the one named); pretraining text tokenized and packed per domain into ``packed/``;
6. ``data_card.json`` and ``data_card.md``: sources, counts, tokens, what each filter removed,
   duplicate rates before and after, decontamination hits by suite, mixture weights per phase.

``validate`` reads every source row once before a run folder exists, so bad input with
``on_error: fail`` never leaves a half-written run.

``executor: inline`` (the default) runs steps 2–4 in this process and ``dedup.workers`` helpers;
``executor: local`` (``tasks``, ``workers``) or ``slurm`` (array jobs, ``slurm:`` settings) runs them
as a datatrove pipeline (:mod:`smolforge.data.datatrove_pipeline`); step 5 and the card are the same.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.errors import RecipeError
from smolforge.recipe import build, to_dict
from smolforge.registry import suite_folders
from smolforge.runs import Run, Runs, write_json_atomic

from .dedup import DedupSpec
from .filters import FilterSpec, QualityFilter
from .sources import BadRows, Source, iter_rows, source_formats, source_label, validate_source
from .safety import safety_conversations, safety_pairs
from .synthetic import World, chat_text

KINDS = {"pretrain": "text", "sft": "chat", "prefs": "preference", "prompts": "prompt", "feedback": "feedback"}
# What the world fills when a recipe names no sources and no world.kinds. Not feedback: the world's would be
# its preference pairs again, one row an answer (what `smolforge kto` makes of prefs anyway), so every demo
# run would dedup, decontaminate and count them twice, and `kto` on the demo would switch from its balanced
# pairs to them. `world: {kinds: [..., feedback]}` asks for it (World.feedback: unbalanced, 2:1).
WORLD_DEFAULT = ("pretrain", "sft", "prefs", "prompts")


@dataclass
class WorldSpec:
    seed: int = 0                  # seeds the entities, facts and every generated file
    entities: int = 40             # made-up creatures with three facts each
    pretrain_docs: int = 6000      # short documents in the pretraining corpus
    preference_pairs: int = 400    # correct-vs-flawed answer pairs for DPO
    long_docs: int = 0             # long documents (domain "long": ledgers, hidden pass keys) for long-context training
    long_doc_words: int = 600      # words per long document (≈ 1.5 tokens a word with the demo tokenizer)
    reasoning: bool = False        # dual-mode SFT: multi-step sums with /think traces and /no_think answers
    safety: bool = False           # harmful requests with refusals, edgy-but-benign ones with answers (SFT, and
                                   # half as many preference pairs again); the red-team suite stays held out
    tools: bool = False            # tool use: three-digit sums through the calculator (SFT conversations with tool
                                   # calls, RL prompts of kind "tool"); the `tools` eval suite holds its problems out
    kinds: list | None = None      # kinds the world fills; unset: all but feedback when sources: is empty, else none


@dataclass
class DecontamSpec:
    enabled: bool = True           # check every kind against the eval suites
    suites: list = field(default_factory=list)   # extra suite folders; every registered suite is always included
    ngram: int = 13                # words per n-gram (13, as in the GPT-3 and Llama reports)
    min_words: int = 8             # eval items shorter than this are not indexed (too short to mean leakage)
    action: str = "remove"         # remove matching rows, or flag them (report only)


@dataclass
class PackSpec:
    enabled: bool = True           # write packed/ for pretraining
    seq_len: int = 256             # tokens per row; pretraining with another seq_len packs at load time


@dataclass
class TokenizerSpec:
    path: str | None = None        # an existing HF tokenizer folder to reuse instead of training one
    vocab_size: int = 1024         # BPE vocabulary size (an upper bound on a small corpus)
    min_frequency: int = 2         # merges seen fewer times are not learned


@dataclass
class SlurmSpec:
    partition: str = "debug"       # partition the array jobs go to
    time: str = "01:00:00"         # time limit of each job (HH:MM:SS)
    venv: str | None = None        # virtualenv the jobs activate (folder or bin/activate); None: the running one
    cpus_per_task: int = 1         # CPUs per datatrove task
    mem_per_cpu_gb: int = 2        # memory per CPU


EXECUTORS = ("inline", "local", "slurm")


@dataclass
class Recipe:
    name: str = "data-demo"        # run name
    world: WorldSpec = field(default_factory=WorldSpec)
    sources: dict = field(default_factory=dict)   # kind → path, source mapping or list of them; other kinds come from the world
    on_error: str = "fail"         # fail at the first bad row, or skip (bad rows counted and listed)
    filters: FilterSpec = field(default_factory=FilterSpec)
    dedup: DedupSpec = field(default_factory=DedupSpec)
    decontaminate: DecontamSpec = field(default_factory=DecontamSpec)
    mixture: list = field(default_factory=list)   # pretraining phases [{until, weights: {domain: w}}]; empty = natural mix
    pack: PackSpec = field(default_factory=PackSpec)
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    rows_per_shard: int = 50_000   # rows per data/<kind>/part-*.jsonl
    progress: bool = True          # progress bars on stderr
    executor: str = "inline"       # inline: one process pool; local | slurm: a datatrove pipeline (docs/data.md)
    tasks: int = 1                 # datatrove tasks: each kind is split into this many parts (local, slurm)
    workers: int = field(default=1, metadata={"negative": True})   # datatrove tasks at once (local: processes; slurm: -1 = no limit)
    logging_dir: str = "datatrove/logs"   # datatrove's logs, stats and Slurm output, inside the run folder
    slurm: SlurmSpec = field(default_factory=SlurmSpec)   # executor: slurm only


# --------------------------------------------------------------------------- recipe checks


def parse_sources(recipe: Recipe) -> dict[str, list[Source]]:
    """``sources:`` as ``{kind: [Source, ...]}``; a bare string is a path."""
    out: dict[str, list[Source]] = {}
    for kind, value in (recipe.sources or {}).items():
        if kind not in KINDS:
            close = difflib.get_close_matches(str(kind), list(KINDS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RecipeError(f"sources: unknown kind '{kind}'{hint}; expected {', '.join(KINDS)}")
        items = value if isinstance(value, list) else [value]
        if not items:
            raise RecipeError(f"sources.{kind}: empty list (leave the kind out to use the synthetic world)")
        parsed = []
        for i, item in enumerate(items):
            where = f"sources.{kind}[{i}]"
            source = build(Source, {"path": item} if isinstance(item, str) else item, "data recipe", prefix=f"{where}.")
            validate_source(source, where, KINDS[kind])
            parsed.append(source)
        out[kind] = parsed
    return out


def suites_to_check(spec: DecontamSpec) -> dict[str, Path]:
    folders = suite_folders()
    for item in spec.suites:
        path = Path(item)
        if not path.is_dir():
            raise RecipeError(f"decontaminate.suites: {item} is not a folder (expected a suite of JSONL files)")
        folders[path.name] = path
    return folders


def _check_numbers(recipe: Recipe) -> None:
    d, c = recipe.dedup, recipe.decontaminate
    checks = [
        (recipe.on_error in ("fail", "skip"), f"on_error is {recipe.on_error!r}; expected fail or skip"),
        (recipe.world.entities >= 1 and recipe.world.pretrain_docs >= 1 and recipe.world.preference_pairs >= 1,
         "world.entities, world.pretrain_docs and world.preference_pairs must be at least 1"),
        (recipe.world.long_docs >= 0 and recipe.world.long_doc_words >= 20,
         "world.long_docs must be >= 0 and world.long_doc_words >= 20"),
        (d.shingle_size >= 1 and d.num_perm >= 2 and d.bands >= 1 and d.rows >= 1 and d.workers >= 1,
         "dedup.shingle_size, bands, rows and workers must be >= 1 and num_perm >= 2"),
        (d.bands * d.rows <= d.num_perm,
         f"dedup.bands x dedup.rows = {d.bands * d.rows} exceeds dedup.num_perm {d.num_perm}"),
        (c.ngram >= 1 and c.min_words >= 1, "decontaminate.ngram and decontaminate.min_words must be >= 1"),
        (c.action in ("remove", "flag"), f"decontaminate.action is {c.action!r}; expected remove or flag"),
        (recipe.pack.seq_len >= 8, f"pack.seq_len must be at least 8, got {recipe.pack.seq_len}"),
        (recipe.rows_per_shard >= 1, "rows_per_shard must be at least 1"),
        (recipe.tokenizer.vocab_size >= 300,
         f"tokenizer.vocab_size must be at least 300 (256 bytes + specials), got {recipe.tokenizer.vocab_size}"),
    ]
    checks += _executor_checks(recipe)
    for ok, message in checks:
        if not ok:
            raise RecipeError(message)
    if recipe.tokenizer.path is not None and not (Path(recipe.tokenizer.path) / "tokenizer_config.json").is_file():
        _check_hub_tokenizer(str(recipe.tokenizer.path))


def _check_hub_tokenizer(ref: str) -> None:
    """A ``tokenizer.path`` that is no local folder must be a hub id whose tokenizer loads (from the
    hub, or offline from the HF cache)."""
    if Path(ref).exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", ref):
        raise RecipeError(f"tokenizer.path {ref}: not a tokenizer folder (no tokenizer_config.json) nor a hub id (org/name)")
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(ref)
    except Exception as err:  # noqa: BLE001 - offline, unknown repo, gated: all say the same to the user
        offline = " (HF_HUB_OFFLINE is set: a hub tokenizer must already be in the HF cache)" \
            if os.environ.get("HF_HUB_OFFLINE") else ""
        raise RecipeError(f"tokenizer.path {ref}: could not load this hub tokenizer{offline}: "
                          f"{type(err).__name__}: {str(err).splitlines()[0][:200]}") from None


def _executor_checks(recipe: Recipe) -> list[tuple[bool, str]]:
    if recipe.executor not in EXECUTORS:
        close = difflib.get_close_matches(str(recipe.executor), EXECUTORS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return [(False, f"executor is {recipe.executor!r}{hint}; expected inline, local or slurm")]
    f, s = recipe.filters, recipe.slurm
    inline = recipe.executor == "inline"
    log = Path(recipe.logging_dir)
    return [
        (recipe.tasks >= 1, f"tasks must be at least 1, got {recipe.tasks}"),
        (recipe.workers >= 1 or (recipe.executor == "slurm" and recipe.workers == -1),
         f"workers must be at least 1 (or -1 with executor: slurm), got {recipe.workers}"),
        (not log.is_absolute() and ".." not in log.parts and str(log) not in ("", "."),
         f"logging_dir {recipe.logging_dir!r} must be a folder inside the run folder (a relative path)"),
        (recipe.dedup.clusters in ("first", "connected"),
         f"dedup.clusters is {recipe.dedup.clusters!r}; expected first or connected"),
        (not inline or recipe.dedup.clusters == "first",
         "dedup.clusters: connected is datatrove's MinhashDedupCluster: set executor: local or slurm"),
        (inline or not recipe.dedup.paragraphs,
         "dedup.paragraphs (corpus-wide paragraph dedup) runs on executor: inline only"),
        (not inline or not (f.c4 or f.fineweb),
         "filters.c4 and filters.fineweb are datatrove's filters: set executor: local or slurm"),
        (recipe.executor != "local" or recipe.workers <= recipe.tasks,
         f"workers ({recipe.workers}) exceeds tasks ({recipe.tasks})"),
        (s.cpus_per_task >= 1 and s.mem_per_cpu_gb >= 1, "slurm.cpus_per_task and slurm.mem_per_cpu_gb must be >= 1"),
        (bool(re.fullmatch(r"(\d+-)?\d+(:\d{2}){0,2}", str(s.time))),
         f"slurm.time {s.time!r}: expected [D-]HH:MM:SS, e.g. 01:00:00"),
    ]


def _slurm_ready(recipe: Recipe) -> None:
    """executor: slurm needs sbatch/squeue on PATH, a reachable controller and a venv to activate."""
    for tool in ("sbatch", "squeue", "scancel", "sinfo"):
        if shutil.which(tool) is None:
            raise RecipeError(f"executor: slurm needs '{tool}' on PATH (install Slurm's client tools)")
    venv = _venv_activate(recipe.slurm.venv)
    if recipe.slurm.venv is not None and venv is None:
        raise RecipeError(f"slurm.venv {recipe.slurm.venv}: no bin/activate there (expected a virtualenv)")
    import subprocess

    probe = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True)
    if probe.returncode != 0:
        hint = "" if os.environ.get("SLURM_CONF") else " (SLURM_CONF is not set)"
        raise RecipeError(f"executor: slurm: cannot reach the Slurm controller{hint}: {probe.stderr.strip()[:200]}")
    partitions = {p.rstrip("*") for p in probe.stdout.split()}
    if recipe.slurm.partition not in partitions:
        raise RecipeError(f"slurm.partition '{recipe.slurm.partition}' is not a partition of this cluster "
                          f"({', '.join(sorted(partitions)) or 'none'})")


def _venv_activate(venv: str | None) -> str | None:
    """The activate script for ``venv`` (a venv folder or its bin/activate); the running venv's for None."""
    if venv is None:
        from .datatrove_pipeline import default_venv

        return default_venv()
    path = Path(venv)
    if path.is_dir():
        path = path / "bin" / "activate"
    return str(path.resolve()) if path.is_file() else None


def world_kinds(recipe: Recipe, sources: dict[str, list[Source]]) -> list[str]:
    """The kinds the synthetic world fills: ``world.kinds``, else its default kinds (:data:`WORLD_DEFAULT`:
    every kind but ``feedback``) when the recipe names no sources, else none (a recipe with real
    documents never gets toy-world rows by surprise). ``world.kinds`` is the whole list: feedback from
    the world comes with the kinds named beside it.

    >>> world_kinds(Recipe(), {}), world_kinds(Recipe(sources={"pretrain": "docs/"}), {"pretrain": []})
    (['pretrain', 'sft', 'prefs', 'prompts'], [])
    >>> world_kinds(Recipe(world=WorldSpec(kinds=["feedback", "pretrain", "sft", "prefs", "prompts"])), {})
    ['pretrain', 'sft', 'prefs', 'prompts', 'feedback']
    >>> world_kinds(Recipe(world=WorldSpec(kinds=["sft", "prompt"])), {})
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: world.kinds: unknown kind 'prompt' (did you mean 'prompts'?); expected pretrain, sft, prefs, prompts, feedback
    """
    asked = recipe.world.kinds
    if asked is None:
        return [] if sources else list(WORLD_DEFAULT)
    if not isinstance(asked, list) or not all(isinstance(kind, str) for kind in asked):
        raise RecipeError(f"world.kinds: expected a list of kinds ({', '.join(KINDS)}), got {asked!r}")
    for kind in asked:
        if kind not in KINDS:
            close = difflib.get_close_matches(kind, list(KINDS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RecipeError(f"world.kinds: unknown kind '{kind}'{hint}; expected {', '.join(KINDS)}")
        if kind in sources:
            raise RecipeError(f"world.kinds: '{kind}' has sources too (sources.{kind}); a kind comes from one or the "
                              "other")
    return [kind for kind in KINDS if kind in asked]


def known_domains(recipe: Recipe, sources: dict[str, list[Source]]) -> set[str] | None:
    """Pretraining domains knowable before reading rows (None when rows may carry their own)."""
    if "pretrain" not in sources:
        if "pretrain" not in world_kinds(recipe, sources):
            return set()
        return {"facts", "math"} | ({"long"} if recipe.world.long_docs else set())
    stamped = [s.domain for s in sources["pretrain"]]
    return set(stamped) if all(stamped) else None


def validate(recipe: Recipe, runs: Runs) -> None:
    """Every check that can fail before a run folder exists, including every source row."""
    parse_sources(recipe)          # the recipe's own shape first, before a tokenizer is looked up
    _check_numbers(recipe)
    QualityFilter(recipe.filters)
    if recipe.executor != "inline":
        import importlib.util

        if importlib.util.find_spec("datatrove") is None or importlib.util.find_spec("orjson") is None:
            raise RecipeError(f"executor: {recipe.executor} needs datatrove and orjson: pip install datatrove orjson")
    if recipe.executor == "slurm":
        _slurm_ready(recipe)
    sources = parse_sources(recipe)
    filled = set(sources) | set(world_kinds(recipe, sources))
    if recipe.tokenizer.path is None and not filled & {"pretrain", "sft"}:
        raise RecipeError("tokenizer: nothing to train it on (no pretrain or sft rows: give sources for one, add it "
                          "to world.kinds, or set tokenizer.path)")
    if recipe.decontaminate.enabled:
        suites_to_check(recipe.decontaminate)
    check_mixture(recipe.mixture, known_domains(recipe, sources))
    for kind, kind_sources in sources.items():
        bad = BadRows()
        for source in kind_sources:
            for _ in iter_rows(source, KINDS[kind], recipe.on_error, bad):
                pass


def check_mixture(phases: list, domains: set[str] | None) -> list[dict]:
    """Phases as ``[{"until", "weights"}]`` with weights normalised; RecipeError on a bad one.

    >>> check_mixture([{"until": 0.5, "weights": {"web": 3}}, {"until": 1.0, "weights": {"web": 1, "math": 1}}], None)
    [{'until': 0.5, 'weights': {'web': 1.0}}, {'until': 1.0, 'weights': {'math': 0.5, 'web': 0.5}}]
    """
    out, ends = [], []
    for i, phase in enumerate(phases):
        if not isinstance(phase, dict) or set(phase) - {"until", "weights"} or not isinstance(phase.get("weights"), dict):
            raise RecipeError(f"mixture[{i}]: expected {{until: <fraction>, weights: {{domain: weight}}}}, got {phase!r}")
        until, weights = float(phase.get("until", 1.0)), phase["weights"]
        if any(not isinstance(w, (int, float)) or w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise RecipeError(f"mixture[{i}].weights must be numbers >= 0 with a positive sum, got {weights}")
        if domains is not None and set(weights) - domains:
            unknown = ", ".join(sorted(set(weights) - domains))
            raise RecipeError(f"mixture[{i}]: unknown domain(s) {unknown}; the data has {', '.join(sorted(domains))}")
        total = sum(weights.values())
        out.append({"until": until, "weights": {d: round(w / total, 6) for d, w in sorted(weights.items())}})
        ends.append(until)
    if ends and (ends != sorted(ends) or ends[-1] != 1.0 or ends[0] <= 0):
        raise RecipeError(f"mixture: phase 'until' values must increase and end at 1.0, got {ends}")
    return out


# --------------------------------------------------------------------------- the run


def _rows_of(kind: str, recipe: Recipe, sources: dict[str, list[Source]], bad: BadRows, labels: list):
    """``(where, row)`` for a kind: its sources in order, the synthetic world, or nothing."""
    if kind not in sources and kind not in world_kinds(recipe, sources):
        return
    if kind in sources:
        for source in sources[kind]:
            entry = {"source": source_label(source), "format": "+".join(source_formats(source)), "rows": 0}
            labels.append(entry)
            for item in iter_rows(source, KINDS[kind], recipe.on_error, bad):
                entry["rows"] += 1
                yield item
        return
    spec = recipe.world
    world = World.generate(seed=spec.seed, n_entities=spec.entities)

    def pairs() -> list[dict]:
        return (world.preference_pairs(n_pairs=spec.preference_pairs, seed=spec.seed + 2)
                + (safety_pairs(spec.preference_pairs // 2, seed=spec.seed + 6) if spec.safety else []))

    generated = {"pretrain": lambda: (world.pretrain_corpus(n_docs=spec.pretrain_docs, seed=spec.seed + 1)
                                      + world.long_documents(spec.long_docs, spec.long_doc_words, seed=spec.seed + 5)),
                 "sft": lambda: (world.sft_conversations(reasoning=spec.reasoning)
                                 + (safety_conversations() if spec.safety else [])
                                 + (world.tool_conversations() if spec.tools else [])),
                 "prefs": pairs,
                 "feedback": lambda: World.feedback(pairs()),
                 "prompts": lambda: world.rl_prompts() + (world.tool_prompts() if spec.tools else [])}[kind]()
    labels.append({"source": f"synthetic world (seed {spec.seed}, {spec.entities} entities)",
                   "format": "synthetic", "rows": len(generated)})
    for i, row in enumerate(generated, start=1):
        yield f"world {kind} row {i}", row


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from . import card as cards
    from .decontaminate import EvalIndex
    from .prepare import ProcessSpec, process_kind
    from .shards import kind_files

    started = time.perf_counter()
    sources = parse_sources(recipe)
    suites = suites_to_check(recipe.decontaminate) if recipe.decontaminate.enabled else {}
    index = (EvalIndex.from_suites(list(suites.values()), n=recipe.decontaminate.ngram,
                                   min_words=recipe.decontaminate.min_words) if suites else None)
    from_world = world_kinds(recipe, sources)
    empty = [kind for kind in KINDS if kind not in sources and kind not in from_world]
    print(f"data {recipe.name}: " + "; ".join(part for part in (
        f"from sources: {', '.join(sources)}" if sources else "",
        f"from the embedded synthetic world: {', '.join(from_world)}" if from_world else "",
        f"left empty: {', '.join(empty)} (world.kinds fills them from the synthetic world)" if empty else "") if part),
        file=sys.stderr, flush=True)
    with runs.start("data", recipe.name, to_dict(recipe), overwrite=overwrite) as run:
        reports = run.reports_dir
        card: dict = {"name": recipe.name, "on_error": recipe.on_error, "kinds": {}, "world_kinds": from_world,
                      "decontamination_suites": {n: str(p) for n, p in suites.items()}}
        bad_rows: dict[str, BadRows] = {kind: BadRows() for kind in KINDS}
        labels: dict[str, list[dict]] = {kind: [] for kind in KINDS}
        if recipe.executor == "inline":
            for kind in KINDS:
                spec = ProcessSpec(filters=recipe.filters if kind == "pretrain" else None,
                                   dedup=recipe.dedup if kind == "pretrain" else
                                   DedupSpec(exact=recipe.dedup.exact, near=False, paragraphs=False),
                                   index=index, decontam_action=recipe.decontaminate.action,
                                   rows_per_shard=recipe.rows_per_shard)
                card["kinds"][kind] = process_kind(kind, _rows_of(kind, recipe, sources, bad_rows[kind], labels[kind]),
                                                   run.data_shard_dir(kind), spec, reports_folder=reports,
                                                   progress=recipe.progress)
            card["executor"] = {"executor": "inline", "tasks": 1, "workers": recipe.dedup.workers}
        else:
            card["kinds"], card["executor"] = _datatrove(recipe, run, sources, index, bad_rows, labels)
        for kind in KINDS:
            card["kinds"][kind]["sources"] = labels[kind]
            card["kinds"][kind]["bad_rows"] = bad_rows[kind].as_dict()
        cards.write_bad_rows(reports / "bad_rows.jsonl", bad_rows)
        tokenizer = _tokenizer(recipe, run, kind_files)
        card["tokenizer"] = {"path": recipe.tokenizer.path or "trained on the kept pretrain + sft text",
                             "vocab_size": len(tokenizer)}
        if recipe.pack.enabled:  # tokenizes the pretraining text once, for the rows and the counts
            card["packed"] = cards.pack(run.path, tokenizer, recipe.pack.seq_len)
            domains = {d: {"documents": v["documents"]} for d, v in card["packed"]["domains"].items()}
            counted = cards.count_tokens(run.path, tokenizer, kinds=("sft", "prefs", "prompts", "feedback"))
            card["tokens"] = {"pretrain": sum(v["tokens"] for v in card["packed"]["domains"].values()), **counted}
        else:
            domains = cards.domain_counts(run.path)
            card["tokens"] = cards.count_tokens(run.path, tokenizer)
        phases = check_mixture(recipe.mixture, set(domains))
        card["domains"] = domains
        if phases:
            card["mixture"], card["mixture_source"] = phases, "recipe"
        else:  # what pretraining does without phases: sample rows uniformly, i.e. domains by size
            sizes = ({d: v["rows"] for d, v in card["packed"]["domains"].items()} if "packed" in card
                     else {d: v["documents"] for d, v in domains.items()})
            card["mixture"] = cards.natural_mixture(sizes)
            card["mixture_source"] = f"natural (domains weighted by {'packed rows' if 'packed' in card else 'documents'})"
        fingerprints = cards.fingerprints(run.path)
        card["fingerprints"] = fingerprints
        card["seconds"] = round(time.perf_counter() - started, 2)
        write_json_atomic(run.data_card_path, card)
        cards.write_summary(run.data_card_md_path, card)
        run.info["data_fingerprints"] = fingerprints
        run.finish(metrics=cards.metrics(card))
    return run


def _datatrove(recipe: Recipe, run: Run, sources, index, bad_rows, labels) -> tuple[dict, dict]:
    """Every kind through datatrove's executors (:mod:`smolforge.data.datatrove_pipeline`)."""
    from . import datatrove_pipeline as dt

    settings = dt.Settings(executor=recipe.executor, tasks=recipe.tasks, workers=recipe.workers,
                           filters=recipe.filters, dedup=recipe.dedup, index=index,
                           decontam_action=recipe.decontaminate.action, job_name=f"smolforge-{recipe.name}",
                           partition=recipe.slurm.partition, time=str(recipe.slurm.time),
                           venv=_venv_activate(recipe.slurm.venv) if recipe.executor == "slurm" else None,
                           cpus_per_task=recipe.slurm.cpus_per_task, mem_per_cpu_gb=recipe.slurm.mem_per_cpu_gb)
    rows = ((kind, _rows_of(kind, recipe, sources, bad_rows[kind], labels[kind])) for kind in KINDS)
    reports, info = dt.process(rows, run.path, settings, logging_dir=recipe.logging_dir,
                               rows_per_shard=recipe.rows_per_shard)
    folder = run.reports_dir
    folder.mkdir(parents=True, exist_ok=True)
    for kind, report in reports.items():
        removed = report.pop("removed")
        with (folder / f"removed-{kind}.jsonl").open("w", encoding="utf-8") as handle:
            for item in removed:
                handle.write(json.dumps(item, ensure_ascii=False) + "\n")
        hits = report["decontamination"]
        if hits["hits"]:
            with (folder / f"decontamination-{kind}.jsonl").open("w", encoding="utf-8") as handle:
                for hit in report.pop("hit_list"):
                    handle.write(json.dumps(hit) + "\n")
        report.pop("hit_list", None)
    info["rule_changes"] = dt.rule_changes(recipe.filters, recipe.dedup)
    return reports, info


def _tokenizer(recipe: Recipe, run: Run, kind_files):
    from transformers import AutoTokenizer

    from .shards import read_files
    from .tokenizer import CHAT_TEMPLATE, train_tokenizer

    spec = recipe.tokenizer
    if spec.path:
        tokenizer = AutoTokenizer.from_pretrained(spec.path)
        if tokenizer.chat_template is None:
            tokenizer.chat_template = CHAT_TEMPLATE
    else:
        def texts():
            yield from (row["text"] for _, row in read_files(kind_files(run.path, "pretrain")))
            yield from (chat_text(row["messages"]) for _, row in read_files(kind_files(run.path, "sft")))

        tokenizer = train_tokenizer(texts(), spec.vocab_size, spec.min_frequency)
    tmp = run.tokenizer_dir.with_name(f".{run.tokenizer_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(run.tokenizer_dir)
    return tokenizer


def summary(run: Run) -> str:
    """The readable data card, printed by ``smolforge data prepare``."""
    path = run.data_card_md_path
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def as_json(run: Run) -> dict:
    """The data card as one JSON object, printed by ``smolforge data prepare RECIPE --json``."""
    path = run.data_card_path
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else run.info
