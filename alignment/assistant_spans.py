"""Assistant-only loss on any chat template: the assistant spans, derived from the rendered conversation.

TRL trains on assistant tokens only through ``{% generation %}`` markers in the chat template, and
patches a few template families it knows; almost every released template has no markers
(SmolLM2, Qwen2.5, Llama 3, Gemma, Mistral), so TRL raises. Here the spans come from the
template itself: for each assistant turn ``i`` of a conversation,

- ``prompt_i`` = the template on ``messages[:i]`` with the generation prompt (what the model sees
  when it has to answer), and ``turn_i`` = the template on ``messages[:i + 1]``;
- both must be prefixes of the whole conversation's rendering (the template preserves prefixes),
  and ``turn_i`` must extend ``prompt_i``;
- the span is ``[len(prompt_i), len(turn_i))`` less trailing whitespace: the answer and its
  end-of-turn token (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ``</s>``), so the model
  learns to stop, but not the newline a template puts between turns.

Tokens whose first character lies inside a span are trained on (``assistant_masks`` = 1). A template
that breaks the rule (one that rewrites earlier turns, as Qwen3 drops old reasoning, or raises on a
role order) gets :class:`TemplateSpanError` naming the row and why.

    >>> from transformers import PreTrainedTokenizerFast
    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> raw = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    >>> raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    >>> tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    >>> tok.chat_template = ("{% for m in messages %}<{{ m.role[0] }}>{{ m.content }};\\n{% endfor %}"
    ...                      "{% if add_generation_prompt %}<a>{% endif %}")
    >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    >>> text, spans = assistant_spans(tok, chat)
    >>> text, spans, [text[a:b] for a, b in spans]
    ('<u>hi;\\n<a>yo;\\n', [(10, 13)], ['yo;'])
    >>> ids, mask = assistant_mask(tok, chat)
    >>> len(ids) == len(text), mask[10:14]
    (True, [1, 1, 1, 0])
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from smolforge.errors import DataError, RecipeError

__all__ = ["TemplateSpanError", "has_generation_markers", "assistant_spans", "assistant_mask", "template_label",
           "check_template", "tokenize_rows", "CHECK_ROWS"]

_MARKER = re.compile(r"{%-?\s*generation\s*-?%}")
CHECK_ROWS = 32          # conversations rendered by the check before a run exists
_FAMILIES = (("<|im_start|>", "ChatML"), ("<|start_header_id|>", "Llama 3"), ("<start_of_turn>", "Gemma"),
             ("[INST]", "Mistral/Llama 2"), ("<|user|>", "Zephyr/Phi"))


class TemplateSpanError(DataError):
    """The chat template does not let the assistant spans of a conversation be derived."""


def has_generation_markers(template: str | None) -> bool:
    """Whether ``template`` marks assistant text with ``{% generation %}`` (TRL then masks by itself).

    >>> has_generation_markers("{% generation %}{{ m }}{% endgeneration %}"), has_generation_markers("{{ m }}")
    (True, False)
    """
    return bool(template and _MARKER.search(template))


def template_label(tokenizer) -> str:
    """How an error names the template: its family by its markers, its owner and a short hash.

    >>> class T: chat_template = "<|im_start|>{{ m }}"; name_or_path = "models/smollm2"
    >>> template_label(T())
    "the ChatML chat template of 'models/smollm2' (sha256 fcdb7d9b764a)"
    """
    template = getattr(tokenizer, "chat_template", None) or ""
    family = next((name for marker, name in _FAMILIES if marker in template), "unrecognised")
    digest = hashlib.sha256(template.encode()).hexdigest()[:12]
    owner = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    return f"the {family} chat template of '{owner}' (sha256 {digest})"


def _render(tokenizer, messages: Sequence[dict], generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as exc:  # noqa: BLE001 - jinja's raise_exception, missing variables...: one line for the user
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TemplateSpanError(f"the template cannot render it ({type(exc).__name__}: {text})") from None


def assistant_spans(tokenizer, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of every assistant turn in it (module doc)."""
    whole = _render(tokenizer, messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], True) if i else ""
        turn = whole if i == len(messages) - 1 else _render(tokenizer, messages[:i + 1], False)
        if not whole.startswith(prompt):
            raise TemplateSpanError(
                f"the prompt before assistant turn {i} (rendered with the generation prompt) is not a prefix of the "
                f"whole conversation; they part at {_parting(prompt, whole)}")
        if not whole.startswith(turn):
            raise TemplateSpanError(
                f"the conversation up to assistant turn {i} is not a prefix of the whole conversation (the template "
                f"rewrites earlier turns); they part at {_parting(turn, whole)}")
        if not turn.startswith(prompt) or len(turn) <= len(prompt):
            raise TemplateSpanError(f"assistant turn {i} does not follow its generation prompt in the rendering")
        end = len(turn.rstrip())
        if end <= len(prompt):
            raise TemplateSpanError(f"assistant turn {i} renders as whitespace only")
        spans.append((len(prompt), end))
    if not spans:
        raise TemplateSpanError("the conversation has no assistant turn")
    return whole, spans


def _parting(short: str, long: str) -> str:
    at = next((k for k, (a, b) in enumerate(zip(short, long)) if a != b), min(len(short), len(long)))
    return f"character {at}: {short[max(0, at - 20):at + 20]!r} vs {long[max(0, at - 20):at + 20]!r}"


def assistant_mask(tokenizer, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_masks)`` of one conversation: the template's text tokenized as
    ``apply_chat_template(tokenize=True)`` does (no special tokens added), 1 on assistant tokens."""
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask, k = [], 0
    for start, _ in encoded["offset_mapping"]:
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        mask.append(int(k < len(spans) and spans[k][0] <= start < spans[k][1]))
    return list(encoded["input_ids"]), mask


def _row_label(row: dict, index: int) -> str:
    return str(row.get("_where") or f"conversation {index + 1}")


def _choices(tokenizer, why: str, where: str) -> RecipeError:
    return RecipeError(
        f"assistant-only loss: cannot derive the assistant tokens of {where} from {template_label(tokenizer)}: "
        f"{why}. Choose one: give the recipe a template that preserves prefixes (chat_template: a Jinja string, "
        f"or one with {{% generation %}} markers), or train on the whole conversation "
        f"(trainer.assistant_only_loss: false)")


def check_template(tokenizer, rows: Sequence[dict], limit: int = CHECK_ROWS) -> None:
    """RecipeError with the choices when the spans of the first ``limit`` conversations cannot be derived."""
    for index, row in enumerate(rows[:limit]):
        try:
            assistant_spans(tokenizer, row["messages"])
        except TemplateSpanError as exc:
            raise _choices(tokenizer, str(exc), _row_label(row, index)) from None


def tokenize_rows(tokenizer, rows: Sequence[dict]) -> tuple[list[dict], float]:
    """Every conversation as ``{"input_ids", "assistant_masks"}`` (what TRL trains on, pre-tokenized),
    and the fraction of tokens that are trained on; RecipeError naming the first row that fails."""
    out, trained, total = [], 0, 0
    for index, row in enumerate(rows):
        try:
            ids, mask = assistant_mask(tokenizer, row["messages"])
        except TemplateSpanError as exc:
            raise _choices(tokenizer, str(exc), _row_label(row, index)) from None
        out.append({"input_ids": ids, "assistant_masks": mask})
        trained += sum(mask)
        total += len(mask)
    return out, (trained / total if total else 0.0)
