"""Assistant-only loss on released chat templates without {% generation %} markers (alignment/assistant_spans.py):
golden masks per template family, built from the template text (TRL's bundled copies of the released
templates where it ships one), and the clear errors where spans cannot be derived."""
from __future__ import annotations

from pathlib import Path

import pytest
import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from smolforge.alignment.assistant_spans import (TemplateSpanError, assistant_mask, assistant_spans, check_template,
                                                 has_generation_markers, tokenize_rows)
from smolforge.errors import RecipeError

TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<s>", "</s>"]

# SmolLM2-135M-Instruct's template as its GGUF carries it: ChatML with a default system turn.
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
           "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# SmolLM3's dual-mode shape: a metadata system turn stating the reasoning mode, /think and /no_think flags,
# and in /no_think an empty think block opening every answer and the generation prompt.
SMOLLM3 = """{%- set mode = "/think" if enable_thinking is not defined or enable_thinking else "/no_think" -%}
{%- set custom = "" -%}
{%- if messages[0].role == "system" -%}
  {%- if "/no_think" in messages[0].content %}{% set mode = "/no_think" %}{% elif "/think" in messages[0].content %}{% set mode = "/think" %}{% endif -%}
  {%- set custom = messages[0].content.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}
{{- "<|im_start|>system\\n## Metadata\\n\\nReasoning Mode: " + mode + "\\n\\n## Custom Instructions\\n\\n" -}}
{{- (custom if custom else "You are a helpful AI assistant named SmolLM, trained by Hugging Face.") + "\\n\\n<|im_end|>\\n" -}}
{%- for message in messages -%}
  {%- if message.role == "user" -%}{{ "<|im_start|>user\\n" + message.content + "<|im_end|>\\n" }}
  {%- elif message.role == "assistant" -%}
    {%- if mode == "/think" -%}{{ "<|im_start|>assistant\\n" + message.content.lstrip("\\n") + "<|im_end|>\\n" }}
    {%- else -%}{{ "<|im_start|>assistant\\n<think>\\n\\n</think>\\n" + message.content.lstrip("\\n") + "<|im_end|>\\n" }}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ "<|im_start|>assistant\\n" if mode == "/think" else "<|im_start|>assistant\\n<think>\\n\\n</think>\\n" }}{%- endif -%}"""
# Mistral-7B-Instruct's shape: [INST] turns, answers closed by </s>, strict alternation.
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")

CHAT = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital is Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."}]
SYSTEM = [{"role": "system", "content": "Answer briefly."}] + CHAT


@pytest.fixture(scope="module")
def base_tokenizer():
    """A byte-level BPE trained on the fly, holding every family's special tokens."""
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    corpus = [m["content"] for m in SYSTEM] * 20 + ["system user assistant model Reasoning Mode think Metadata"] * 20
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return raw


def family(raw, template: str, bos: str, eos: str) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=bos, eos_token=eos, pad_token=eos)
    tok.chat_template = template
    return tok


def trained_pieces(tok, messages) -> list[str]:
    """The decoded runs of consecutive trained tokens."""
    ids, mask = assistant_mask(tok, messages)
    pieces, run = [], []
    for token, bit in zip(ids + [None], mask + [0]):
        if bit:
            run.append(token)
        elif run:
            pieces.append(tok.decode(run))
            run = []
    return pieces


FAMILIES = {
    "smollm2-chatml-default-system": (SMOLLM2, "<|im_start|>", "<|im_end|>", CHAT,
                                      ["The capital is Paris.<|im_end|>", "Rome.<|im_end|>"]),
    "qwen2.5-chatml-default-system": ((TRL_TEMPLATES / "qwen2_5.jinja").read_text(), "<|endoftext|>", "<|im_end|>",
                                      SYSTEM, ["The capital is Paris.<|im_end|>", "Rome.<|im_end|>"]),
    "llama3": ((TRL_TEMPLATES / "llama3.jinja").read_text(), "<|begin_of_text|>", "<|eot_id|>", SYSTEM,
               ["The capital is Paris.<|eot_id|>", "Rome.<|eot_id|>"]),
    "llama3.2": ((TRL_TEMPLATES / "llama3_2.jinja").read_text(), "<|begin_of_text|>", "<|eot_id|>", SYSTEM,
                 ["The capital is Paris.<|eot_id|>", "Rome.<|eot_id|>"]),
    "smollm3-think": (SMOLLM3, "<|im_start|>", "<|im_end|>",
                      [{"role": "system", "content": "/think"}, CHAT[0],
                       {"role": "assistant", "content": "<think>\nFrance: Paris.\n</think>\nParis."}],
                      ["<think>\nFrance: Paris.\n</think>\nParis.<|im_end|>"]),
    "smollm3-no-think": (SMOLLM3, "<|im_start|>", "<|im_end|>",
                         [{"role": "system", "content": "Answer briefly. /no_think"}] + CHAT,
                         ["The capital is Paris.<|im_end|>", "Rome.<|im_end|>"]),
    "gemma": ((TRL_TEMPLATES / "gemma.jinja").read_text(), "<bos>", "<eos>", CHAT,
              ["The capital is Paris.<end_of_turn>", "Rome.<end_of_turn>"]),
    "mistral": (MISTRAL, "<s>", "</s>", CHAT, ["The capital is Paris.</s>", "Rome.</s>"]),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_golden_assistant_mask_for_each_template_family(base_tokenizer, name):
    template, bos, eos, messages, golden = FAMILIES[name]
    tok = family(base_tokenizer, template, bos, eos)
    assert not has_generation_markers(template)      # TRL alone would refuse assistant-only loss here
    assert trained_pieces(tok, messages) == golden   # each answer and its end-of-turn token, nothing else
    ids, mask = assistant_mask(tok, messages)
    # the ids are what the template tokenizes to, and the untrained rest holds every prompt and header
    assert ids == tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    prompt_text = tok.decode([t for t, m in zip(ids, mask) if not m])
    assert all(m["content"].replace("/no_think", "").replace("/think", "").strip() in prompt_text
               for m in messages if m["role"] != "assistant")


def test_smollm3_no_think_keeps_the_empty_think_block_in_the_prompt(base_tokenizer):
    """The generation prompt of /no_think ends in the empty think block, so it is context, not a target."""
    tok = family(base_tokenizer, SMOLLM3, "<|im_start|>", "<|im_end|>")
    messages = FAMILIES["smollm3-no-think"][3]
    text, spans = assistant_spans(tok, messages)
    assert all(text[:start].endswith("<|im_start|>assistant\n<think>\n\n</think>\n") for start, _ in spans)


def test_gemma_refuses_a_system_turn_with_the_choices(base_tokenizer):
    tok = family(base_tokenizer, (TRL_TEMPLATES / "gemma.jinja").read_text(), "<bos>", "<eos>")
    with pytest.raises(RecipeError) as caught:
        check_template(tok, [{"messages": CHAT}, {"messages": SYSTEM, "_where": "chats.jsonl line 2"}])
    message = str(caught.value)
    assert "chats.jsonl line 2" in message and "Gemma chat template" in message
    assert "System role not supported" in message
    assert "chat_template:" in message and "trainer.assistant_only_loss: false" in message


def test_a_template_that_rewrites_earlier_turns_is_named_with_the_turn(base_tokenizer):
    """Qwen3 drops the think block of answers before the last question: turn 1 alone renders otherwise."""
    tok = family(base_tokenizer, (TRL_TEMPLATES / "qwen3.jinja").read_text(), "<|endoftext|>", "<|im_end|>")
    assert trained_pieces(tok, CHAT[:2]) == ["<think>\n\n</think>\n\nThe capital is Paris.<|im_end|>"]
    with pytest.raises(TemplateSpanError, match="up to assistant turn 1 is not a prefix .* rewrites earlier turns"):
        assistant_spans(tok, CHAT)
    with pytest.raises(RecipeError, match=r"conversation 1 from the ChatML chat template .* rewrites earlier turns"):
        tokenize_rows(tok, [{"messages": CHAT}])


def test_tokenize_rows_reports_the_trained_fraction(base_tokenizer):
    tok = family(base_tokenizer, SMOLLM2, "<|im_start|>", "<|im_end|>")
    rows, fraction = tokenize_rows(tok, [{"messages": CHAT}, {"messages": CHAT[:2]}])
    assert [sorted(r) for r in rows] == [["assistant_masks", "input_ids"]] * 2
    trained = sum(sum(r["assistant_masks"]) for r in rows)
    assert fraction == pytest.approx(trained / sum(len(r["input_ids"]) for r in rows)) and 0 < fraction < 0.5
