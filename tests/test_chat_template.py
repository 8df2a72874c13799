"""The dual-mode chat template (data/tokenizer.py): SmolLM3's /think and /no_think, as golden strings,
and TRL's assistant-only mask over the think block."""
from __future__ import annotations

import pytest

from smolforge.data.tokenizer import EMPTY_THINK, train_tokenizer

TRACE = "<think>\nBo has 2. He gets 3 more. 2 + 3 = 5.\n</think>\n"


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["Bo has 2 apples and gets 3 more: 5. Think step by step."] * 40, vocab_size=320)


def render(tok, messages, **kwargs) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


USER = {"role": "user", "content": "How many?"}


@pytest.mark.parametrize(("messages", "kwargs", "golden"), [
    # no flag: think mode, byte for byte plain ChatML (what every run before this template trained on)
    ([USER, {"role": "assistant", "content": "5"}], {},
     "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"),
    ([USER], {"add_generation_prompt": True}, "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n"),
    # /no_think: the system turn states it (SmolLM3's "Reasoning Mode:" line; the flag leaves the custom
    # text), so the prompts of the two modes differ; every answer and the prompt get an empty think block
    ([{"role": "system", "content": "Count. /no_think"}, USER, {"role": "assistant", "content": "5"}], {},
     "<|im_start|>system\nCount.\nReasoning Mode: /no_think<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n"
     "<|im_start|>assistant\n<think>\n\n</think>\n5<|im_end|>\n"),
    ([{"role": "system", "content": "/no_think"}, USER], {"add_generation_prompt": True},
     "<|im_start|>system\nReasoning Mode: /no_think<|im_end|>\n"
     "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n"),
    # /think: the answer carries its own trace; the prompt leaves the model to open <think>
    # /think, the default: plain ChatML; the answer carries its own trace, the prompt leaves <think> to the model
    ([{"role": "system", "content": "/think"}, USER, {"role": "assistant", "content": TRACE + "5"}], {},
     "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n" + TRACE + "5<|im_end|>\n"),
    ([{"role": "system", "content": "Count. /think"}, USER], {"add_generation_prompt": True},
     "<|im_start|>system\nCount.<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n"),
    # enable_thinking=False (SmolLM3's switch) when the system prompt says nothing; a flag wins over it
    ([USER], {"add_generation_prompt": True, "enable_thinking": False},
     "<|im_start|>system\nReasoning Mode: /no_think<|im_end|>\n"
     "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n"),
    ([{"role": "system", "content": "/think"}, USER], {"add_generation_prompt": True, "enable_thinking": False},
     "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n"),
    # a plain system prompt: no mode stated, plain ChatML
    ([{"role": "system", "content": "Count."}, USER], {"add_generation_prompt": True},
     "<|im_start|>system\nCount.<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n"),
], ids=["plain", "plain-prompt", "no-think", "no-think-prompt", "think-trace", "think-prompt",
        "enable-thinking-false", "flag-wins", "plain-system"])
def test_both_modes_render_as_golden_strings(tok, messages, kwargs, golden):
    assert render(tok, messages, **kwargs) == golden


@pytest.mark.parametrize(("system", "answer", "trained"), [
    ("/no_think", "5", EMPTY_THINK + "5<|im_end|>"),
    ("/think", TRACE + "5", TRACE + "5<|im_end|>"),
])
def test_the_assistant_mask_covers_the_think_block(tok, system, answer, trained):
    messages = [{"role": "system", "content": system}, USER, {"role": "assistant", "content": answer}]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask) and 0 < sum(mask) < len(ids)
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == trained   # the think block is trained on
    assert "<|im_start|>assistant\n" in tok.decode([i for i, m in zip(ids, mask) if not m])  # the header is not
