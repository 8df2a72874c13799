"""Public dataset shapes, as published, turned into smolforge's rows.

The stages read four row shapes (:mod:`smolforge.data.schemas`): ``chat`` (``{"messages"}``),
``preference`` (``{"prompt", "chosen", "rejected"}``), ``prompt`` (``{"prompt", "answer"?}``) and
``feedback`` (``{"prompt", "completion", "label"}``).
Public datasets publish others. Each named shape here turns one row of its layout into a
smolforge row, or raises a DataError naming the file and row, the field, and the layout expected.
A source names one with ``shape:`` (or ``format:``); ``auto``, the default, tells them apart by
the row's keys, and so do stages reading a ``.jsonl`` directly (``data: file.jsonl``).

Chat rows (SFT):

- ``messages``: ``messages`` plus extra columns (``source``, ``id``…): HuggingFaceTB/smoltalk,
  allenai/tulu-3-sft-mixture, TRL conversational, smolforge's own. The row as it is, less a
  ``prompt`` or ``completion`` column (TRL's SFTTrainer would read the row as prompt-completion).
- ``reasoning``: ``problem`` + ``generations`` (``<think>…</think>`` traces, with
  ``is_reasoning_complete`` and ``correctness_*`` marks) and/or ``messages``: open-r1/OpenR1-Math-220k.
  The row's own ``messages``, else the problem and its first complete, correct generation; the
  answer keeps its trace and starts with ``<think>`` (think mode of the dual-mode template).

Preference rows (DPO, reward models):

- ``explicit``: ``prompt``, ``chosen``, ``rejected`` (strings or messages): TRL explicit, smolforge's own.
- ``ultrafeedback``: ``prompt`` string, ``chosen``/``rejected`` whole conversations repeating the
  user turn, ``messages``, ``score_chosen``, ``score_rejected``, ``prompt_id``:
  HuggingFaceH4/ultrafeedback_binarized. Prompt = the shared leading turns, chosen/rejected = the
  final assistant turns (TRL's explicit conversational format).
- ``implicit``: ``chosen``/``rejected`` conversations only: TRL implicit prompt. Split at their
  longest common prefix of whole messages.
- ``hh``: ``chosen``/``rejected`` strings of ``\\n\\nHuman:`` / ``\\n\\nAssistant:`` turns:
  Anthropic/hh-rlhf. Parsed into messages, then split as ``implicit``.

Split pairs must differ only in their last assistant turn, else a DataError names the row.

Prompt rows (GRPO, RLOO, PPO; verifiers read ``answer``):

- ``prompt``: ``prompt`` (+ ``answer``): TRL prompt-only, smolforge's own.
- ``gsm8k``: ``question``, ``answer`` (worked steps with ``<<48/2=24>>`` annotations, then
  ``#### 72``): openai/gsm8k. ``{"prompt": question, "answer": "72"}``, thousands commas dropped.
- ``math``: ``problem``, ``solution`` ending in ``\\boxed{…}``: hendrycks MATH, HuggingFaceH4/MATH-500,
  OpenR1-Math. ``{"prompt": problem, "answer": ...}``: the row's own ``answer`` where it has one,
  else the last boxed content (nested braces kept).

Feedback rows (KTO; unpaired: one answer marked good or bad):

- ``unpaired``: ``prompt``, ``completion`` (strings, or messages: the conversation so far and the
  answer), ``label`` (a boolean, true = desirable): TRL unpaired preference, trl-lib/kto-mix-14k,
  smolforge's own. The row as it is. Pairs are not split into feedback here: they go under
  ``prefs``, which ``smolforge kto`` reads as two rows each when a data run has no feedback.

Aliases: ``smoltalk`` and ``tulu`` are ``messages``, ``openr1`` is ``reasoning``, ``hh-rlhf`` is ``hh``,
``kto`` and ``kto-mix`` are ``unpaired``.
Pretraining text (``{"text"}``) has no other shape: map a column with ``columns: {text: ...}``.

Columns a published shape does not read ride along when they hold a plain value (text, number,
boolean): provenance such as ``source``, ``prompt_id``, ``score_chosen``/``score_rejected``,
``level``. Nulls, lists and objects of a published layout (UltraFeedback's copy of the chosen
conversation in ``messages``, OpenR1's ``generations`` and correctness lists) are left out. The
UltraFeedback scores stay two columns, not a ``margin``: TRL's reward trainer would read a margin
into its loss, on a 1-10 scale no reward head starts on.

    >>> hh = {"chosen": "\\n\\nHuman: Hi?\\n\\nAssistant: Hello!", "rejected": "\\n\\nHuman: Hi?\\n\\nAssistant: Go away."}
    >>> normalize(hh, "preference", "hh.jsonl line 1")  # doctest: +NORMALIZE_WHITESPACE
    {'prompt': [{'role': 'user', 'content': 'Hi?'}], 'chosen': [{'role': 'assistant', 'content': 'Hello!'}],
     'rejected': [{'role': 'assistant', 'content': 'Go away.'}]}
    >>> normalize({"question": "Ann has 1,000 and spends 5. Left?", "answer": "1000-5=<<1000-5=995>>995\\n#### 995"},
    ...           "prompt", "gsm8k.jsonl line 1")
    {'prompt': 'Ann has 1,000 and spends 5. Left?', 'answer': '995'}
    >>> normalize({"chosen": "fine", "score": 3}, "preference", "raw/p.jsonl line 3")
    Traceback (most recent call last):
    ...
    smolforge.errors.DataError: raw/p.jsonl line 3: a preference row needs prompt+chosen+rejected (TRL explicit), chosen+rejected conversations (TRL implicit), or HH-style strings with "\\n\\nHuman:" turns; found keys chosen, score
    >>> kto_mix = {"prompt": [{"content": "Name a prime.", "role": "user"}],
    ...            "completion": [{"content": "7", "role": "assistant"}], "label": True}
    >>> normalize(kto_mix, "feedback", "kto.jsonl line 1") == kto_mix
    True
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from smolforge.errors import DataError, RecipeError

__all__ = ["AUTO", "ALIASES", "NAMES", "SHAPES", "Shape", "detect", "fitting", "last_boxed", "normalize",
           "published_columns", "resolve"]

AUTO = "auto"


@dataclass(frozen=True)
class Shape:
    name: str                                  # what shape: (or format:) names in a source
    schema: str                                # the smolforge row it becomes: chat, preference, prompt or feedback
    keys: tuple[str, ...]                      # the columns that tell the layout apart (auto-detection)
    layout: str                                # how errors name the layout
    convert: Callable[[dict, str], dict]       # (row, where) -> smolforge row; DataError when it cannot


# --------------------------------------------------------------------------- helpers


def _found(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "a string" if value.strip() else "an empty string"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return {list: "a list", dict: "an object"}.get(type(value), f"a value of type {type(value).__name__}")


def _keys(row: dict) -> str:
    return f"found keys {', '.join(map(str, row))}" if row else "found no keys"


def _extras(row: dict, read: set[str]) -> dict:
    """The columns a published shape did not read that hold plain values (provenance, scores)."""
    return {k: v for k, v in row.items() if k not in read and isinstance(v, (str, int, float, bool))}


def _field(row: dict, name: str, where: str, shape: str):
    if name not in row:
        keys = ", ".join(SHAPES[shape].keys)
        raise DataError(f"{where}: field '{name}' is missing (a {shape} row has {keys}; {_keys(row)})")
    return row[name]


def _text(row: dict, name: str, where: str, shape: str) -> str:
    value = _field(row, name, where, shape)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field '{name}' must be a non-empty string ({SHAPES[shape].layout}), "
                        f"found {_found(value)}")
    return value


def _conversation(row: dict, name: str, where: str, shape: str) -> list:
    value = _field(row, name, where, shape)
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        raise DataError(f"{where}: field '{name}' must be a non-empty list of messages, the whole conversation "
                        f"({SHAPES[shape].layout}), found {_found(value)}")
    return value


def _roles(turns: list) -> str:
    return ", ".join(str(m.get("role")) if isinstance(m, dict) else "?" for m in turns) or "nothing"


def _split(chosen: list, rejected: list, where: str) -> tuple[list, list, list]:
    """(prompt, chosen answer, rejected answer) of two conversations that differ only in their last
    assistant turn: the prompt is their longest common prefix of whole messages."""
    if chosen == rejected:
        raise DataError(f"{where}: fields 'chosen' and 'rejected' are identical; the pair teaches nothing")
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise DataError(f"{where}: fields 'chosen' and 'rejected' share no leading turn (expected one conversation "
                        f"that differs only in its last assistant turn)")
    tails = {"chosen": chosen[shared:], "rejected": rejected[shared:]}
    if any(len(t) != 1 or not isinstance(t[0], dict) or t[0].get("role") != "assistant" for t in tails.values()):
        raise DataError(f"{where}: fields 'chosen' and 'rejected' differ before their last assistant turn: after "
                        f"{shared} shared turn(s) chosen has {_roles(tails['chosen'])} and rejected "
                        f"{_roles(tails['rejected'])} (expected one assistant turn each)")
    for name, (answer,) in tails.items():
        if not isinstance(answer.get("content"), str) or not answer["content"].strip():
            raise DataError(f"{where}: field '{name}' ends with an empty assistant turn")
    return chosen[:shared], tails["chosen"], tails["rejected"]


def _whole_conversation(value) -> bool:
    """A chosen/rejected list that starts before the answer (UltraFeedback repeats the user turn)."""
    return (isinstance(value, list) and bool(value) and isinstance(value[0], dict)
            and value[0].get("role") in ("system", "user"))


_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def _is_hh(value) -> bool:
    return isinstance(value, str) and ("\n\nHuman:" in value or value.lstrip().startswith("Human:"))


def _hh_turns(row: dict, name: str, where: str) -> list[dict]:
    text = _text(row, name, where, "hh")
    parts = _HH_TURN.split(text.lstrip())
    if parts[0].strip() or len(parts) < 3 or parts[1] != "Human":
        raise DataError(f"{where}: field '{name}' does not start with a \"\\n\\nHuman:\" turn "
                        f"({SHAPES['hh'].layout})")
    return [{"role": _HH_ROLES[role], "content": content.strip()} for role, content in zip(parts[1::2], parts[2::2])]


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed +([^\s$]+)")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) in ``text``, nested braces kept; None if none.

    >>> last_boxed(r"so $x = \\boxed{\\frac{1}{2}}$, not \\boxed{3}? No: \\boxed{\\dfrac{\\sqrt{2}}{2}}.")
    '\\\\dfrac{\\\\sqrt{2}}{2}'
    """
    found = None
    for match in _BOXED.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found = (match.start(), text[match.end():i - 1].strip())
    bare = list(_BOXED_BARE.finditer(text))
    if bare and (found is None or bare[-1].start() > found[0]):
        return bare[-1].group(1)
    return found[1] if found else None


# --------------------------------------------------------------------------- the shapes


def _messages(row: dict, where: str) -> dict:
    # A prompt or completion column beside messages makes TRL's SFTTrainer read the row as
    # prompt-completion (tulu-3-sft-personas-* carry a prompt column); the messages hold it anyway.
    return {k: v for k, v in row.items() if k not in ("prompt", "completion")}


def _trace(text, where: str, field: str) -> str:
    """An assistant answer that carries a complete ``<think>…</think>`` trace, starting with ``<think>``
    (the dual-mode template gives any other answer, under /no_think, an empty think block)."""
    if not isinstance(text, str) or "</think>" not in text:
        raise DataError(f"{where}: field '{field}' has no complete <think>…</think> trace "
                        f"({SHAPES['reasoning'].layout}), found {_found(text)}")
    text = text.lstrip()
    return text if text.startswith("<think>") else "<think>\n" + text   # R1-style: the template opened it


def _generation(row: dict, where: str) -> tuple[int, str]:
    """The first generation that is a complete trace and, where the row marks correctness, correct."""
    generations = _field(row, "generations", where, "reasoning")
    if not isinstance(generations, list) or not generations:
        raise DataError(f"{where}: field 'generations' must be a non-empty list of strings "
                        f"({SHAPES['reasoning'].layout}), found {_found(generations)}")

    def mark(name: str, i: int):
        value = row.get(name)
        return value[i] if isinstance(value, list) and i < len(value) else None

    complete = [i for i, g in enumerate(generations)
                if isinstance(g, str) and "</think>" in g and mark("is_reasoning_complete", i) is not False]
    if not complete:
        raise DataError(f"{where}: none of the {len(generations)} generations is a complete <think>…</think> trace")
    marks = [name for name in ("correctness_math_verify", "correctness_llama") if isinstance(row.get(name), list)]
    if marks:
        complete = [i for i in complete if any(mark(name, i) is True for name in marks)]
        if not complete:
            raise DataError(f"{where}: none of the {len(generations)} generations with a complete trace is marked "
                            f"correct ({' or '.join(marks)})")
    return complete[0], generations[complete[0]]


_REASONING_READS = {"problem", "solution", "generations", "messages", "is_reasoning_complete",
                    "correctness_math_verify", "correctness_llama", "finish_reasons"}


def _reasoning(row: dict, where: str) -> dict:
    if isinstance(row.get("messages"), list) and row["messages"]:
        messages = [dict(m) if isinstance(m, dict) else m for m in row["messages"]]
        answers = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
        if answers:       # no assistant turn at all: the chat schema says so
            last = answers[-1]
            messages[last]["content"] = _trace(messages[last].get("content"), where, f"messages[{last}].content")
    else:
        problem = _text(row, "problem", where, "reasoning")
        i, generation = _generation(row, where)
        messages = [{"role": "user", "content": problem},
                    {"role": "assistant", "content": _trace(generation, where, f"generations[{i}]")}]
    return {"messages": messages, **_extras(row, _REASONING_READS)}


def _explicit(row: dict, where: str) -> dict:
    return row


def _ultrafeedback(row: dict, where: str) -> dict:
    chosen = _conversation(row, "chosen", where, "ultrafeedback")
    rejected = _conversation(row, "rejected", where, "ultrafeedback")
    prompt, chosen, rejected = _split(chosen, rejected, where)
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected,
            **_extras(row, {"prompt", "chosen", "rejected", "messages"})}


def _implicit(row: dict, where: str) -> dict:
    chosen = _conversation(row, "chosen", where, "implicit")
    rejected = _conversation(row, "rejected", where, "implicit")
    prompt, chosen, rejected = _split(chosen, rejected, where)
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, **_extras(row, {"chosen", "rejected"})}


def _hh(row: dict, where: str) -> dict:
    prompt, chosen, rejected = _split(_hh_turns(row, "chosen", where), _hh_turns(row, "rejected", where), where)
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, **_extras(row, {"chosen", "rejected"})}


def _prompt(row: dict, where: str) -> dict:
    return row


def _unpaired(row: dict, where: str) -> dict:
    return row


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _gsm8k(row: dict, where: str) -> dict:
    question = _text(row, "question", where, "gsm8k")
    answer = _text(row, "answer", where, "gsm8k")
    if "####" not in answer:
        raise DataError(f"{where}: field 'answer' has no final '#### <answer>' line ({SHAPES['gsm8k'].layout}); "
                        f"for other question/answer rows map columns: {{prompt: question}}")
    final = _THOUSANDS.sub("", answer.rsplit("####", 1)[1].strip())
    if not final:
        raise DataError(f"{where}: field 'answer' has nothing after its '####'")
    return {"prompt": question, "answer": final, **_extras(row, {"question", "answer"})}


def _math(row: dict, where: str) -> dict:
    problem = _text(row, "problem", where, "math")
    answer = row.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():     # MATH itself: the solution's last box
        answer = last_boxed(_text(row, "solution", where, "math"))
        if not answer:
            raise DataError(f"{where}: field 'solution' has no \\boxed{{…}} answer ({SHAPES['math'].layout}) "
                            f"and the row no 'answer'")
    return {"prompt": problem, "answer": answer.strip(), **_extras(row, {"problem", "solution", "answer"})}


SHAPES: dict[str, Shape] = {shape.name: shape for shape in (
    Shape("messages", "chat", ("messages",), "messages: smoltalk, Tulu 3, TRL conversational", _messages),
    Shape("reasoning", "chat", ("problem", "generations"),
          "OpenR1-Math: problem + generations with <think> traces, or messages", _reasoning),
    Shape("explicit", "preference", ("prompt", "chosen", "rejected"), "TRL explicit: prompt, chosen, rejected",
          _explicit),
    Shape("ultrafeedback", "preference", ("prompt", "chosen", "rejected"),
          "UltraFeedback binarized: chosen and rejected are whole conversations", _ultrafeedback),
    Shape("implicit", "preference", ("chosen", "rejected"),
          "TRL implicit prompt: chosen and rejected conversations with a shared prefix", _implicit),
    Shape("hh", "preference", ("chosen", "rejected"),
          "Anthropic HH-RLHF: strings of \"\\n\\nHuman:\" / \"\\n\\nAssistant:\" turns", _hh),
    Shape("prompt", "prompt", ("prompt",), "TRL prompt-only: prompt, optional answer", _prompt),
    Shape("gsm8k", "prompt", ("question", "answer"), "GSM8K: question, answer ending '#### 72'", _gsm8k),
    Shape("math", "prompt", ("problem", "solution"), "MATH: problem, solution with \\boxed{…}", _math),
    Shape("unpaired", "feedback", ("prompt", "completion", "label"),
          "TRL unpaired preference, trl-lib/kto-mix-14k: prompt, completion, label", _unpaired),
)}
ALIASES = {"smoltalk": "messages", "tulu": "messages", "openr1": "reasoning", "hh-rlhf": "hh",
           "kto": "unpaired", "kto-mix": "unpaired"}
NAMES = frozenset(SHAPES) | frozenset(ALIASES)     # disjoint from the file formats (sources.FORMATS)

# What a row of each kind needs, for the error an unrecognised row gets.
_EXPECTED = {
    "chat": "messages (smoltalk, Tulu 3, TRL conversational) or problem+generations (OpenR1-Math reasoning traces)",
    "preference": "prompt+chosen+rejected (TRL explicit), chosen+rejected conversations (TRL implicit), or "
                  "HH-style strings with \"\\n\\nHuman:\" turns",
    "prompt": "prompt (TRL prompt-only), question+answer (GSM8K) or problem+solution (MATH)",
    "feedback": "prompt+completion+label (TRL unpaired preference, trl-lib/kto-mix-14k; label true for a desirable "
                "answer)",
}


# --------------------------------------------------------------------------- choosing a shape


def resolve(name: str, schema: str | None = None, where: str = "shape") -> Shape | None:
    """The shape ``name`` names (None for ``auto``); RecipeError for an unknown name or, given
    ``schema``, a shape that makes another kind of row.

    >>> resolve("smoltalk").name, resolve("auto")
    ('messages', None)
    >>> resolve("gsm8k", "preference", "sources.prefs[0].shape")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: sources.prefs[0].shape: 'gsm8k' makes prompt rows, not preference rows (preference shapes: auto, explicit, ultrafeedback, implicit, hh)
    """
    if name == AUTO:
        return None
    if not isinstance(name, str) or name not in NAMES:
        close = difflib.get_close_matches(str(name), sorted(NAMES), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise RecipeError(f"{where}: unknown shape {name!r}{hint}; expected auto or one of "
                          f"{', '.join(SHAPES)} (aliases: {', '.join(ALIASES)})")
    shape = SHAPES[ALIASES.get(name, name)]
    if schema is not None and shape.schema != schema:
        names = [s.name for s in SHAPES.values() if s.schema == schema]
        known = f"{schema} shapes: {', '.join([AUTO] + names)}" if names else f"{schema} rows take shape: auto only"
        raise RecipeError(f"{where}: {name!r} makes {shape.schema} rows, not {schema} rows ({known})")
    return shape


def fitting(columns, schema: str) -> list[str]:
    """Shapes of ``schema`` whose telling columns are all among ``columns`` (a file's schema, say).

    >>> fitting(["question", "answer", "id"], "prompt")
    ['gsm8k']
    """
    present = set(columns)
    return [s.name for s in SHAPES.values() if s.schema == schema and set(s.keys) <= present]


def published_columns(schema: str) -> list[str]:
    """The columns of each published layout of ``schema`` beyond smolforge's own, for error hints.

    >>> published_columns("preference"), published_columns("text")
    (['chosen+rejected (implicit, hh)'], [])
    """
    own = next((s.keys for s in SHAPES.values() if s.schema == schema), None)
    groups: dict[tuple, list[str]] = {}
    for shape in SHAPES.values():
        if shape.schema == schema and shape.keys != own:
            groups.setdefault(shape.keys, []).append(shape.name)
    return [f"{'+'.join(keys)} ({', '.join(names)})" for keys, names in groups.items()]


def detect(row: dict, schema: str, where: str) -> Shape | None:
    """The shape of ``row`` read as ``schema`` (None for pretraining text, which has one shape).

    A row with smolforge's own fields (``messages``; ``prompt``) is read as smolforge's shape, so a
    row missing one of them gets the schema's field-by-field error; otherwise the row's keys pick
    the published shape, and a row that fits none, or several, is a DataError naming its keys.
    """
    if schema not in _EXPECTED:
        return None
    keys = set(row)
    if schema == "chat":
        found = ["reasoning"] if {"problem", "generations"} <= keys else ["messages"] if "messages" in keys else []
    elif schema == "preference":
        if "prompt" in keys:
            whole = _whole_conversation(row.get("chosen")) or _whole_conversation(row.get("rejected"))
            found = ["ultrafeedback" if whole else "explicit"]
        elif {"chosen", "rejected"} <= keys:
            chosen, rejected = row["chosen"], row["rejected"]
            strings = isinstance(chosen, str) and isinstance(rejected, str)
            found = (["implicit"] if isinstance(chosen, list) and isinstance(rejected, list) else
                     ["hh"] if strings and (_is_hh(chosen) or _is_hh(rejected)) else [])
        else:
            found = []
    elif schema == "feedback":    # a completion or a label: the row means to be feedback, the schema names what is missing
        found = ["unpaired"] if keys & {"completion", "label"} else []
    else:
        found = ["prompt"] if "prompt" in keys else fitting(keys, "prompt")
    if not found:      # chat and prompt rows always need smolforge's own field when no other layout fits
        lead = {"chat": "field 'messages' is missing: ", "prompt": "field 'prompt' is missing: "}.get(schema, "")
        pairs = ("; preference pairs go under sources.prefs (smolforge kto reads a data run's prefs, two rows a "
                 "pair, when it has no feedback)" if schema == "feedback" and {"chosen", "rejected"} & keys else "")
        raise DataError(f"{where}: {lead}a {schema} row needs {_EXPECTED[schema]}; {_keys(row)}{pairs}")
    if len(found) > 1:
        fits = " and ".join(f"{n} ({'+'.join(SHAPES[n].keys)})" for n in found)
        raise DataError(f"{where}: the row fits several shapes, {fits}; name one with shape: on its source, or keep "
                        f"one layout's columns; {_keys(row)}")
    return SHAPES[found[0]]


def normalize(row: dict, schema: str, where: str, shape: str = AUTO) -> dict:
    """``row`` in smolforge's ``schema`` (chat, preference, prompt, feedback; text rows pass as they are), read
    as the named ``shape`` or, with ``auto``, as the shape its keys tell (:func:`detect`).

    The result still goes through :func:`smolforge.data.schemas.validate_row`: a shape rearranges
    fields, the schema checks them.
    """
    chosen = resolve(shape, schema, "shape")
    if chosen is None:
        chosen = detect(row, schema, where)
        if chosen is None:
            return row
    return chosen.convert(row, where)
