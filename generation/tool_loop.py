"""Answer prompts with tools: generate, run the tool calls the model writes, feed their answers back.

The loop a tool-using policy runs at evaluation time (GRPO's held-out reward with ``tools:``, the
``tools`` eval suite), in the format of TRL's own training-time loop: the prompt is rendered with the
tools' schemas (``apply_chat_template(..., tools=...)``), the model's turn is read back with the
tokenizer's response parser (``tokenizer.parse_response``: SmolLM3/Hermes/Qwen tool-call formats;
the demo template's in :data:`smolforge.data.tokenizer.RESPONSE_TEMPLATE`), each call runs through
:mod:`smolforge.generation.tools` and its answer comes back as a ``tool`` message, until the model
answers without a call or ``max_iterations`` rounds of calls are spent. Greedy, batched.

A call is *valid* when it parses, names one of the offered tools and passes exactly the arguments
the tool's schema names; anything else (a ``<tool_call>`` that does not parse, an unknown tool,
missing or extra arguments) counts as an invalid call, and the model reads an error as the tool's
answer, as TRL does.

    >>> call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}
    >>> run_call(call, tool_schemas(["calculator"]))
    (True, '5')
    >>> run_call({"function": {"name": "calculator", "arguments": {"expr": "2 + 3"}}}, tool_schemas(["calculator"]))
    (False, "error: calculator takes the arguments ['expression'], got ['expr']")
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from smolforge.errors import RecipeError

from .hf import HFSampler
from .tools import TOOLS, resolve_tools

__all__ = ["ToolTranscript", "tool_schemas", "check_call", "run_call", "parses_calls", "answer_with_tools"]

CALL_OPEN = "<tool_call>"


def parses_calls(tokenizer) -> bool:
    """Whether ``tokenizer`` can read tool calls back (a ``response_template``, or the legacy ``response_schema``)."""
    return getattr(tokenizer, "response_template", None) is not None or \
        getattr(tokenizer, "response_schema", None) is not None


def tool_schemas(tools: Sequence[Any]) -> list[dict]:
    """JSON schemas (the ``{"type": "function", "function": {...}}`` layout chat templates take) for tool
    names of :data:`~smolforge.generation.tools.TOOLS`, schemas as given, or a JSON string of them (a
    public function-calling dataset's ``tools`` column).

    >>> [s["function"]["name"] for s in tool_schemas(["calculator", '[{"name": "lookup", "parameters": {}}]'])]
    ['calculator', 'lookup']
    """
    from transformers.utils import get_json_schema

    out: list[dict] = []
    for tool in tools or []:
        if isinstance(tool, str) and tool.lstrip().startswith(("[", "{")):
            parsed = json.loads(tool)
            out.extend(tool_schemas(parsed if isinstance(parsed, list) else [parsed]))
        elif isinstance(tool, str):
            out.append(get_json_schema(resolve_tools([tool])[0]))
        elif isinstance(tool, dict):
            out.append(tool if "function" in tool else {"type": "function", "function": tool})
        elif callable(tool):
            out.append(get_json_schema(tool))
        else:
            raise RecipeError(f"tools: expected a tool name, a JSON schema or a function, got {tool!r}")
    return out


def check_call(call: Any, schemas: Sequence[dict]) -> tuple[str | None, dict | None, str]:
    """``(name, arguments, "")`` for a valid call against the offered tools' ``schemas``, else
    ``(name, None, the error the model reads)``."""
    function = call.get("function", call) if isinstance(call, dict) else {}
    name, arguments = function.get("name"), function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return name, None, f"error: the arguments of {name} are not JSON"
    offered = {s["function"]["name"]: s["function"] for s in schemas}
    if name not in offered or name not in TOOLS:
        return name, None, f"error: no tool named {name!r} (tools: {', '.join(offered)})"
    expected = sorted(offered[name].get("parameters", {}).get("properties", {}))
    if not isinstance(arguments, dict) or sorted(arguments) != expected:
        got = sorted(arguments) if isinstance(arguments, dict) else type(arguments).__name__
        return name, None, f"error: {name} takes the arguments {expected}, got {got}"
    return name, arguments, ""


def run_call(call: Any, schemas: Sequence[dict]) -> tuple[bool, str]:
    """``(valid, answer)`` for one parsed tool call: the tool's answer, or the error the model reads."""
    name, arguments, error = check_call(call, schemas)
    return (False, error) if arguments is None else (True, str(TOOLS[name](**arguments)))


@dataclass
class ToolTranscript:
    """One prompt answered with tools: the turns after the prompt and what the calls were."""

    messages: list = field(default_factory=list)   # assistant and tool messages, in order
    calls: int = 0                                  # tool calls the model wrote (parsed or not)
    valid_calls: int = 0                            # calls that named an offered tool with its arguments
    answer: str = ""                                # the last assistant text

    @property
    def call_validity(self) -> float | None:
        """Share of this transcript's calls that were valid; None without calls."""
        return self.valid_calls / self.calls if self.calls else None


def _parse(tokenizer, text: str, prefix: str) -> tuple[dict, int]:
    """(assistant message, calls written) for one generated turn; an unparsable turn stays text."""
    written = text.count(CALL_OPEN)
    try:
        message = tokenizer.parse_response(text, prefix=prefix)
    except Exception:  # noqa: BLE001 - a malformed call is the model's error, scored as such, not a crash
        message = {"role": "assistant", "content": text}
    message = {"role": "assistant", "content": message.get("content") or "", **(
        {"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {})}
    return message, max(written, len(message.get("tool_calls", [])))


def answer_with_tools(model, tokenizer, prompts: Sequence[list], tools: Sequence[Any], *, max_new_tokens: int = 48,
                      max_iterations: int = 2, batch_size: int = 32) -> list[ToolTranscript]:
    """Greedy answers to conversational ``prompts`` with ``tools`` (names, schemas or functions) on offer.

    ``max_iterations`` rounds of tool calls at most; a turn that calls a tool after them ends the transcript
    with that turn (its calls checked, not run; no final text). Needs a tokenizer whose chat template renders tools and
    which can parse its own tool calls (``response_template`` / ``response_schema``).
    """
    if not parses_calls(tokenizer):
        raise RecipeError("answering with tools needs a tokenizer that can parse tool calls (response_template); "
                          "the demo tokenizer has one, TRL's add_response_schema sets it for SmolLM3/Qwen/Llama")
    schemas = tool_schemas(tools)
    sampler = HFSampler(model, tokenizer, batch_size=batch_size)
    transcripts = [ToolTranscript() for _ in prompts]
    active = list(range(len(prompts)))
    for iteration in range(max_iterations + 1):
        if not active:
            break
        rendered = [tokenizer.apply_chat_template(list(prompts[i]) + transcripts[i].messages, tools=schemas,
                                                  tokenize=False, add_generation_prompt=True) for i in active]
        samples = sampler.sample(rendered, max_new_tokens=max_new_tokens, temperature=0.0)
        still = []
        for i, prefix, sample in zip(active, rendered, samples):
            text = tokenizer.decode(sample.token_ids, skip_special_tokens=False)
            message, written = _parse(tokenizer, text, prefix)
            transcript = transcripts[i]
            transcript.messages.append(message)
            transcript.calls += written
            if not written:
                transcript.answer = message["content"].strip()
                continue
            last = iteration == max_iterations          # calls past the budget are checked, not run
            for call in message.get("tool_calls", []):
                if last:
                    transcript.valid_calls += check_call(call, schemas)[1] is not None
                    continue
                valid, answer = run_call(call, schemas)
                transcript.valid_calls += valid
                name = (call.get("function", call) or {}).get("name", "tool") if isinstance(call, dict) else "tool"
                transcript.messages.append({"role": "tool", "name": str(name), "content": answer})
            if last:
                continue
            if "tool_calls" not in message:      # a <tool_call> that did not parse: the model reads why
                transcript.messages.append({"role": "tool", "name": "tool", "content": "error: the tool call is not "
                                            "valid JSON of the form {\"name\": …, \"arguments\": {…}}"})
            still.append(i)
        active = still
    return transcripts
