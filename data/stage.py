"""The data stage: datasets and a tokenizer for the stages downstream, as one run.

    smolforge data --config recipes/demo/data.yaml
    smolforge data --config recipes/demo/data.yaml --set world.entities=20 --set world.seed=1

Writes ``runs/<name>/data/{pretrain,sft,prefs}.jsonl`` (from the synthetic world, or from your
own JSONL files given under ``sources:``) and ``runs/<name>/tokenizer/`` (a byte-level BPE
trained on them, with a chat template, or a tokenizer folder you name). Every file is validated
before anything is written; the run records a fingerprint of each.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.errors import RecipeError
from smolforge.recipe import to_dict
from smolforge.runs import Run, Runs, file_fingerprint

from .jsonl import write_jsonl
from .schemas import load_rows
from .synthetic import World, chat_text

KINDS = {"pretrain": "text", "sft": "chat", "prefs": "preference"}


@dataclass
class WorldSpec:
    seed: int = 0                  # seeds the entities, facts and every generated file
    entities: int = 40             # made-up creatures with three facts each
    pretrain_docs: int = 6000      # short documents in the pretraining corpus
    preference_pairs: int = 400    # correct-vs-flawed answer pairs for DPO


@dataclass
class Sources:
    pretrain: str | None = None    # JSONL of {"text"} rows replacing the synthetic corpus
    sft: str | None = None         # JSONL of {"messages"} rows replacing the synthetic conversations
    prefs: str | None = None       # JSONL of {"prompt","chosen","rejected"} rows replacing the synthetic pairs


@dataclass
class TokenizerSpec:
    path: str | None = None        # an existing HF tokenizer folder to reuse instead of training one
    vocab_size: int = 1024         # BPE vocabulary size (an upper bound on a small corpus)
    min_frequency: int = 2         # merges seen fewer times are not learned


@dataclass
class Recipe:
    name: str = "data-demo"        # run name
    world: WorldSpec = field(default_factory=WorldSpec)
    sources: Sources = field(default_factory=Sources)
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)


def validate(recipe: Recipe, runs: Runs) -> None:
    """Check the user's files (every row) and numbers before any work."""
    for kind, schema in KINDS.items():
        path = getattr(recipe.sources, kind)
        if path is not None:
            load_rows(path, schema)
    if recipe.world.entities < 1 or recipe.world.pretrain_docs < 1:
        raise RecipeError("world.entities and world.pretrain_docs must be at least 1")
    if recipe.tokenizer.path is not None and not (Path(recipe.tokenizer.path) / "tokenizer_config.json").is_file():
        raise RecipeError(f"tokenizer.path {recipe.tokenizer.path}: not a tokenizer folder (no tokenizer_config.json)")
    if recipe.tokenizer.vocab_size < 300:
        raise RecipeError(f"tokenizer.vocab_size must be at least 300 (256 bytes + specials), got {recipe.tokenizer.vocab_size}")


def build_rows(recipe: Recipe) -> dict[str, list[dict]]:
    """The three datasets: user files where given, the synthetic world elsewhere."""
    spec = recipe.world
    world = World.generate(seed=spec.seed, n_entities=spec.entities)
    generated = {"pretrain": lambda: world.pretrain_corpus(n_docs=spec.pretrain_docs, seed=spec.seed + 1),
                 "sft": world.sft_conversations,
                 "prefs": lambda: world.preference_pairs(n_pairs=spec.preference_pairs, seed=spec.seed + 2)}
    rows = {}
    for kind, schema in KINDS.items():
        path = getattr(recipe.sources, kind)
        rows[kind] = load_rows(path, schema) if path else generated[kind]()
    return rows


def _tokenizer_texts(rows: dict[str, list[dict]]):
    yield from (r["text"] for r in rows["pretrain"])
    yield from (chat_text(r["messages"]) for r in rows["sft"])


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from transformers import AutoTokenizer

    from .tokenizer import CHAT_TEMPLATE, train_tokenizer

    started = time.perf_counter()
    rows = build_rows(recipe)
    with runs.start("data", recipe.name, to_dict(recipe), overwrite=overwrite) as run:
        data_dir = run.path / "data"
        for kind, kind_rows in rows.items():
            write_jsonl(data_dir / f"{kind}.jsonl", kind_rows)
        tok_spec = recipe.tokenizer
        if tok_spec.path:
            tokenizer = AutoTokenizer.from_pretrained(tok_spec.path)
            if tokenizer.chat_template is None:
                tokenizer.chat_template = CHAT_TEMPLATE
        else:
            tokenizer = train_tokenizer(_tokenizer_texts(rows), tok_spec.vocab_size, tok_spec.min_frequency)
        tmp = run.path / ".tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(tmp)
        tmp.rename(run.path / "tokenizer")
        run.info["data_fingerprints"] = {f"data/{k}.jsonl": file_fingerprint(data_dir / f"{k}.jsonl") for k in KINDS}
        n_tokens = sum(len(ids) for ids in tokenizer([r["text"] for r in rows["pretrain"]])["input_ids"])
        run.finish(metrics={"data/pretrain_docs": len(rows["pretrain"]), "data/pretrain_tokens": n_tokens,
                            "data/sft_conversations": len(rows["sft"]),
                            "data/preference_pairs": len(rows["prefs"]), "data/vocab_size": len(tokenizer),
                            "data/seconds": round(time.perf_counter() - started, 2)})
    return run
