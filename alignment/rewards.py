"""Reward functions for online RL (GRPO, RLOO, PPO): resolving a recipe's rewards, a reward-model scorer,
held-out scoring.

Every reward has TRL's signature ``fn(prompts, completions, **columns) -> list[float | None]``:
dataset columns arrive as keyword lists (``answer=[...]``, ``kind=[...]``), and a completion is a
string or, for conversational data, ``[{"role": "assistant", "content": "..."}]``. ``None`` means
"does not apply to this sample" (TRL then leaves it out of the sum). The built-in verifiers
(``answer_match``, ``arith_verifier``, ``math_match``) live in :mod:`smolforge.generation.verifiers`,
where the scripted annotators reach them too.

    >>> reward = resolve("answer_match")          # what a recipe's ``rewards: [answer_match]`` becomes
    >>> reward.__name__, reward(["Q"], ["Red."], answer=["Kalo likes red."])
    ('answer_match', [0.5])

A recipe names rewards with :func:`resolve`: a built-in (:data:`BUILTINS`), a dotted path
``package.module:function``, or ``run:<reward run>`` for a trained reward model
(:class:`RewardModelScorer`). Resolved rewards are wrapped by :func:`checked`, which turns a
crash or a malformed result into a ``DataError`` naming the function and the batch.
:func:`mean_reward` generates greedily for held-out prompts and scores them: the "held-out
verifier reward before/after" every RL stage reports.
"""
from __future__ import annotations

import difflib
import importlib
import math
from collections.abc import Callable, Sequence
from numbers import Real
from pathlib import Path
from typing import Any

from smolforge.errors import DataError, RecipeError, RunError
from smolforge.generation.verifiers import answer_match, arith_verifier, completion_text, math_match, prompt_text
from smolforge.runs import RunLayout, Runs

__all__ = ["BUILTINS", "OverlongPenalty", "split_weight", "reward_weights", "merged_weights", "answer_match", "arith_verifier", "math_match", "resolve", "checked", "RewardModelScorer",
           "score_pairs", "mean_reward", "completion_text", "prompt_text"]

RewardFn = Callable[..., list]


BUILTINS: dict[str, RewardFn] = {"answer_match": answer_match, "arith_verifier": arith_verifier, "math_match": math_match}


# --------------------------------------------------------------------------- checking


class checked:  # noqa: N801 - used like a function: checked(fn, name)
    """``fn`` wrapped so that failures become DataErrors naming the function and the batch's first prompt.

    An exception inside ``fn``, a result of the wrong length, or a value that is not a finite
    number (None is allowed: "not applicable") raise ``DataError``. ``__name__`` is ``name``, so
    TRL logs ``rewards/<name>/mean``. A class rather than a closure so that it pickles.

    >>> bad = checked(lambda prompts, completions, **kw: [1.0], "one")
    >>> bad(["a", "b"], ["x", "y"])
    Traceback (most recent call last):
    ...
    smolforge.errors.DataError: reward function 'one' returned 1 values for 2 completions (first prompt: 'a')
    """

    def __init__(self, fn: RewardFn, name: str | None = None) -> None:
        self.fn = fn
        self.__name__ = name or getattr(fn, "__name__", type(fn).__name__)

    def __repr__(self) -> str:
        return f"checked({self.__name__})"

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float | None]:
        where = f"(first prompt: {prompt_text(prompts[0])[:80]!r})" if len(prompts) else "(empty batch)"
        try:
            values = self.fn(prompts=prompts, completions=completions, **kwargs)
        except (DataError, RecipeError, RunError) as exc:
            raise DataError(f"reward function '{self.__name__}' {where}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - any crash in user code becomes a DataError
            raise DataError(f"reward function '{self.__name__}' raised {type(exc).__name__}: {exc} {where}") from exc
        try:
            values = list(values)
        except TypeError:
            raise DataError(f"reward function '{self.__name__}' returned {type(values).__name__}, "
                            f"expected a list of floats {where}") from None
        if len(values) != len(completions):
            raise DataError(f"reward function '{self.__name__}' returned {len(values)} values for "
                            f"{len(completions)} completions {where}")
        out: list[float | None] = []
        for i, value in enumerate(values):
            if value is None:
                out.append(None)
                continue
            if hasattr(value, "item") and not isinstance(value, Real):
                try:
                    value = value.item()  # numpy/torch scalars
                except (ValueError, RuntimeError):
                    pass  # not a single number: reported below
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
                raise DataError(f"reward function '{self.__name__}' returned {value!r} for completion {i}; "
                                f"expected a finite number or None {where}")
            out.append(float(value))
        return out


# --------------------------------------------------------------------------- length


class OverlongPenalty:
    """DAPO's soft overlong punishment: 0 up to ``max_tokens − buffer`` tokens, then falling linearly to
    −1 at ``max_tokens``, −1 beyond. Counts the completion's token ids (TRL passes ``completion_ids``).

    >>> penalty = OverlongPenalty(max_tokens=8, buffer=4)
    >>> penalty(["q"] * 4, ["a"] * 4, completion_ids=[[1] * 3, [1] * 4, [1] * 6, [1] * 9])
    [0.0, 0.0, -0.5, -1.0]
    """

    __name__ = "length_penalty"

    def __init__(self, max_tokens: int, buffer: int) -> None:
        if not (isinstance(max_tokens, int) and isinstance(buffer, int) and 0 < buffer <= max_tokens):
            raise RecipeError(f"length_penalty needs whole numbers 0 < buffer <= max_tokens (DAPO: 20480 and 4096), "
                              f"got max_tokens={max_tokens!r}, buffer={buffer!r}")
        self.max_tokens, self.buffer = max_tokens, buffer

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None, **kwargs) -> list[float]:
        if completion_ids is None:
            raise DataError("length_penalty counts completion_ids, which the trainer did not pass")
        start = self.max_tokens - self.buffer
        return [0.0 if len(ids) <= start else max(-1.0, (start - len(ids)) / self.buffer) for ids in completion_ids]


def split_weight(spec: Any) -> tuple[Any, float | None]:
    """A ``rewards:`` entry as (what names the reward, its weight or None). A weight rides on a mapping:
    ``{reward: answer_match, weight: 2}``, ``{judge: {...}, weight: 0.5}``, ``{length_penalty: {...}, weight: 0.2}``.

    >>> split_weight({"reward": "answer_match", "weight": 2}), split_weight("math_match")
    (('answer_match', 2.0), ('math_match', None))
    """
    if not isinstance(spec, dict) or "weight" not in spec:
        return (spec["reward"] if isinstance(spec, dict) and set(spec) == {"reward"} else spec), None
    weight = spec["weight"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise RecipeError(f"rewards: weight must be a number, got {weight!r} in {spec!r}")
    rest = {k: v for k, v in spec.items() if k != "weight"}
    return (rest["reward"] if set(rest) == {"reward"} else rest), float(weight)


def reward_weights(specs: Sequence) -> list[float] | None:
    """One weight per entry of ``rewards:`` (1 where an entry gives none), or None when none gives one.

    >>> reward_weights(["answer_match", {"length_penalty": {"max_tokens": 8, "buffer": 4}, "weight": 0.5}])
    [1.0, 0.5]
    """
    weights = [split_weight(spec)[1] for spec in specs]
    return None if all(w is None for w in weights) else [1.0 if w is None else w for w in weights]


def merged_weights(specs: Sequence, given: Any, field: str) -> list[float] | None:
    """One weight per reward: those beside the rewards (:func:`reward_weights`) or ``given`` (the recipe's
    ``field``, a list of numbers), which must agree where both are set; None: every reward counts once.

    >>> merged_weights([{"reward": "answer_match", "weight": 2}], None, "trainer.reward_weights")
    [2.0]
    >>> merged_weights(["answer_match"], [1.0, 2.0], "trainer.reward_weights")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: trainer.reward_weights lists 2 weights for 1 rewards; give one weight per reward
    """
    if given is not None and (not isinstance(given, (list, tuple)) or not all(
            isinstance(w, Real) and not isinstance(w, bool) and math.isfinite(w) for w in given)):
        raise RecipeError(f"{field} must be a list of numbers, one per reward, got {given!r}")
    inline = reward_weights(specs)
    if inline is not None and given is not None and [float(w) for w in given] != inline:
        raise RecipeError(f"rewards: weights {inline} beside the rewards and {field} {list(given)} disagree; "
                          "give them in one place")
    weights = inline if inline is not None else given
    if weights is not None and len(weights) != len(specs):
        raise RecipeError(f"{field} lists {len(weights)} weights for {len(specs)} rewards; give one weight per reward")
    return None if weights is None else [float(w) for w in weights]


# --------------------------------------------------------------------------- naming rewards


def resolve(spec: str | dict | RewardFn, runs: Runs | None = None) -> RewardFn:
    """The reward a recipe names, wrapped by :func:`checked`.

    ``spec`` is a built-in (``answer_match``, ``arith_verifier``, ``math_match``), a dotted path
    (``package.module:function`` or ``package.module.function``), ``run:<name>`` (a reward run's
    model, scored by :class:`RewardModelScorer`; found in ``runs``, the stage's runs), a mapping
    ``{judge: {endpoint, model, rubric, …}}`` (an LLM judge grading each completion on a rubric,
    :class:`~smolforge.generation.judge.reward.JudgeReward`; its replies cached in the runs' cache), or a callable.

    >>> resolve("smolforge.alignment.rewards:arith_verifier").__name__
    'arith_verifier'
    >>> resolve("answer_mach")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: unknown reward 'answer_mach' (did you mean 'answer_match'?); use a built-in (answer_match, arith_verifier, math_match), a dotted path package.module:function, or run:<reward run>
    """
    if callable(spec):
        return spec if isinstance(spec, checked) else checked(spec)
    spec = split_weight(spec)[0]
    if isinstance(spec, dict) and set(spec) == {"length_penalty"} and isinstance(spec["length_penalty"], dict):
        options = spec["length_penalty"]
        unknown = set(options) - {"max_tokens", "buffer"}
        if unknown:
            raise RecipeError(f"length_penalty takes max_tokens and buffer, not {', '.join(sorted(unknown))}")
        return checked(OverlongPenalty(options.get("max_tokens"), options.get("buffer")), "length_penalty")
    if isinstance(spec, dict) and set(spec) == {"judge"} and isinstance(spec["judge"], dict):
        from smolforge.generation.judge.reward import JudgeReward

        judge = JudgeReward.from_spec(spec["judge"], runs.cache_dir("judge") if runs is not None else None)
        return checked(judge, judge.__name__)
    if not isinstance(spec, str) or not spec.strip():
        raise RecipeError(f"a reward must be a name, a dotted path, run:<name>, {{judge: {{...}}}} or "
                          f"{{length_penalty: {{max_tokens, buffer}}}} (each may carry a weight), got {spec!r}")
    spec = spec.strip()
    if spec in BUILTINS:
        return checked(BUILTINS[spec], spec)
    if spec.startswith("run:"):
        if runs is None:
            raise RecipeError(f"reward '{spec}': a reward run is looked up in the stage's runs; pass them "
                              "(resolve(spec, runs))")
        run = runs.get(spec[len("run:"):].strip())
        return checked(RewardModelScorer(run.path), run.name)
    if ":" in spec or "." in spec:
        return checked(_import(spec), spec.replace(":", ".").rsplit(".", 1)[-1])
    close = difflib.get_close_matches(spec, list(BUILTINS), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise RecipeError(f"unknown reward '{spec}'{hint}; use a built-in ({', '.join(BUILTINS)}), "
                      "a dotted path package.module:function, or run:<reward run>")


def _import(spec: str) -> RewardFn:
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise RecipeError(f"reward '{spec}': cannot import module '{module_name}' ({exc})") from None
    fn = getattr(module, attr, None)
    if fn is None:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        close = difflib.get_close_matches(attr, public, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise RecipeError(f"reward '{spec}': module '{module_name}' has no '{attr}'{hint}")
    if not callable(fn):
        raise RecipeError(f"reward '{spec}' is a {type(fn).__name__}, not a function")
    return fn


# --------------------------------------------------------------------------- reward models


def _device(model) -> Any:
    return next(model.parameters()).device


def _scored_texts(tokenizer, prompts: Sequence, completions: Sequence) -> list[str]:
    """prompt+completion as the RewardTrainer saw them: through the chat template when
    conversational, else concatenated with the eos token appended (as TRL adds it)."""
    texts = []
    for prompt, completion in zip(prompts, completions):
        if isinstance(prompt, (list, tuple)):
            reply = completion if isinstance(completion, (list, tuple)) else \
                [{"role": "assistant", "content": completion_text(completion)}]
            texts.append(tokenizer.apply_chat_template(list(prompt) + list(reply), tokenize=False))
        else:
            text = completion_text(prompt) + completion_text(completion)
            eos = tokenizer.eos_token or ""
            texts.append(text if text.endswith(eos) else text + eos)
    return texts


def score_pairs(model, tokenizer, prompts: Sequence, completions: Sequence, batch_size: int = 16,
                max_length: int | None = None) -> list[float]:
    """One scalar per (prompt, completion) from a sequence-classification model (num_labels=1).

    Tokenised as TRL's RewardTrainer does (chat template without extra special tokens; plain text
    with them and an eos); batched, right-padded, without gradients; the model's mode is restored.
    """
    import torch

    texts = _scored_texts(tokenizer, prompts, completions)
    plain = not (prompts and isinstance(prompts[0], (list, tuple)))  # TRL tokenizes plain text with specials
    was_training = model.training
    model.eval()
    scores: list[float] = []
    try:
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True,
                                  padding_side="right", add_special_tokens=plain,
                                  truncation=max_length is not None, max_length=max_length)
                batch = {k: v.to(_device(model)) for k, v in batch.items()}
                logits = model(**batch).logits
                scores += logits[:, 0].float().tolist()
    finally:
        model.train(was_training)
    return scores


class RewardModelScorer:
    """A reward run's ``model/`` as a TRL reward function: ``scorer(prompts, completions) -> scores``.

    ``run_path`` is a reward run's folder (or its ``model/`` folder). The model is an
    ``AutoModelForSequenceClassification`` with one label, scored on prompt+completion rendered
    exactly as the RewardTrainer tokenised its pairs. ``__name__`` is the run's name.
    """

    def __init__(self, run_path: str | Path, batch_size: int = 16, device: str | None = None) -> None:
        from transformers import AutoModelForSequenceClassification

        from smolforge.devices import local_device
        from smolforge.generation.prompts import load_tokenizer

        path = Path(run_path)
        model_dir = path if (path / "config.json").is_file() else RunLayout(path).model_dir
        if not (model_dir / "config.json").is_file():
            raise RunError(f"'{path}' has no model/ to score with (is it a reward run?)")
        self.__name__ = path.name if model_dir != path else path.parent.name
        self.tokenizer = load_tokenizer(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir)
        if getattr(self.model.config, "num_labels", None) != 1:
            raise RunError(f"'{model_dir}' is a classifier with {self.model.config.num_labels} labels; "
                           "a reward model has exactly one (train it with the reward stage)")
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device or local_device()).eval()   # this rank's card ("cuda" is cuda:0 until accelerate sets a device)
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"RewardModelScorer({self.__name__!r})"

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        return score_pairs(self.model, self.tokenizer, prompts, completions, self.batch_size)


# --------------------------------------------------------------------------- held-out reward


def mean_reward(model, tokenizer, rows: Sequence[dict], reward_fns: Sequence[RewardFn | str] | RewardFn,
                max_new_tokens: int = 32, batch_size: int = 32, runs: Runs | None = None,
                weights: Sequence[float] | None = None, tools: Sequence | None = None,
                max_tool_iterations: int = 2) -> tuple[float, list[dict]]:
    """Greedy completions for held-out prompt rows, scored: ``(mean summed reward, per-row details)``;
    the sum weighted by ``weights`` (one per reward) when given, as the trainer weighs them.

    ``rows`` are prompt rows (``{"prompt", "answer"?, "kind"?...}``); their other columns reach the
    reward functions as keyword lists, as in TRL. Generation is greedy through
    :class:`~smolforge.generation.hf.HFSampler` (batched, left-padded, chat template for
    conversational prompts, stopping at the model's end tokens). A reward of None (not applicable) adds nothing to a row's total. Each detail is
    ``{"prompt", "completion", "rewards": {name: value}, "total"}`` plus the row's other columns.
    A reward named ``run:<name>`` is found in ``runs``. With ``tools`` (names or schemas), each prompt is
    answered through :func:`~smolforge.generation.tool_loop.answer_with_tools` (the calls run, their
    answers read back, ``max_tool_iterations`` rounds at most) and scored on the whole transcript, as TRL
    scores a tool-using rollout; each detail then counts ``tool_calls`` and ``valid_tool_calls``.
    """
    from smolforge.generation.hf import HFSampler

    if callable(reward_fns):
        reward_fns = [reward_fns]
    fns = [resolve(fn, runs) for fn in reward_fns]
    if not fns:
        raise RecipeError("mean_reward needs at least one reward function")
    rows = list(rows)
    if not rows:
        return 0.0, []
    conversational = isinstance(rows[0]["prompt"], (list, tuple))
    prompts = [r["prompt"] for r in rows]
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
    transcripts = None
    if tools:
        from smolforge.generation.tool_loop import answer_with_tools

        if not conversational:
            raise RecipeError("tools need conversational prompts (a list of messages); set chat_prompts: true")
        transcripts = answer_with_tools(model, tokenizer, prompts, tools, max_new_tokens=max_new_tokens,
                                        max_iterations=max_tool_iterations, batch_size=batch_size)
        completions = [t.messages for t in transcripts]
        outputs = [completion_text(t.messages).strip() for t in transcripts]
        columns["completion_ids"] = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in outputs]
    else:
        sampler = HFSampler(model, tokenizer, batch_size=batch_size)
        samples = sampler.sample(prompts, max_new_tokens=max_new_tokens, temperature=0.0)
        outputs = [sample.text.strip() for sample in samples]
        completions = [[{"role": "assistant", "content": t}] for t in outputs] if conversational else outputs
        columns["completion_ids"] = [sample.token_ids for sample in samples]    # as TRL passes them
    scores = {fn.__name__: fn(prompts, completions, **columns) for fn in fns}
    details = []
    for i, row in enumerate(rows):
        rewards = {name: values[i] for name, values in scores.items()}
        factors = dict(zip(scores, weights)) if weights is not None else {}
        total = sum(v * factors.get(name, 1.0) for name, v in rewards.items() if v is not None)
        details.append({**{k: v for k, v in row.items() if k != "prompt"}, "prompt": prompt_text(row["prompt"]),
                        "completion": outputs[i], "rewards": rewards, "total": total})
        if transcripts is not None:
            details[-1].update(tool_calls=transcripts[i].calls, valid_tool_calls=transcripts[i].valid_calls)
    return sum(d["total"] for d in details) / len(details), details
