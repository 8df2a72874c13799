"""Byte-level BPE tokenizers trained on the fly, with a dual-mode ChatML template TRL can mask.

The assistant turn sits inside ``{% generation %}…{% endgeneration %}`` so TRL's
``assistant_only_loss`` finds the tokens to train on. ``<|im_end|>`` is the EOS token (it ends
every assistant turn, so generation stops there); ``<|endoftext|>`` separates pretraining
documents; ``<|pad|>`` pads.

    >>> tok = train_tokenizer(["Zorblax likes the color red."] * 50, vocab_size=300)
    >>> tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
    ...                         add_generation_prompt=True)
    '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
    >>> tok.apply_chat_template([{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "hi"}],
    ...                         tokenize=False, add_generation_prompt=True)
    '<|im_start|>system\\nBe brief.\\nReasoning Mode: /no_think<|im_end|>\\n<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n'
"""
from __future__ import annotations

from collections.abc import Iterable

DOC_SEPARATOR = "<|endoftext|>"
SPECIAL_TOKENS = [DOC_SEPARATOR, "<|im_start|>", "<|im_end|>", "<|pad|>"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EMPTY_THINK = THINK_OPEN + "\n\n" + THINK_CLOSE + "\n"   # what a no-think answer starts with

# SmolLM3's dual mode: "/think" or "/no_think" in the system prompt picks the mode;
# ``enable_thinking=False`` picks no-think when the system prompt does not say. Think is the
# default and renders byte for byte as plain ChatML (the flag leaves the custom text; a reasoning
# answer carries its own <think>…</think>). No-think is stated in the system turn, as SmolLM3's
# template states the mode ("Reasoning Mode: /no_think"), so the model can tell the modes apart
# from the prompt alone; every no-think answer starts with an empty think block (inside the trained
# span) and so does the generation prompt.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(mode='think') %}"
    "{%- if enable_thinking is defined and not enable_thinking %}{%- set ns.mode = 'no_think' %}{%- endif %}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- if '/no_think' in messages[0]['content'] %}{%- set ns.mode = 'no_think' %}"
    "{%- elif '/think' in messages[0]['content'] %}{%- set ns.mode = 'think' %}{%- endif %}"
    "{%- elif ns.mode == 'no_think' %}{{- '<|im_start|>system\\nReasoning Mode: /no_think<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}"
    "{%- if ns.mode == 'no_think' and not message['content'].startswith('<think>') %}"
    "{{- '<think>\\n\\n</think>\\n' }}{%- endif %}"
    "{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message['role'] == 'system' %}"
    "{%- set text = message['content'].replace('/no_think', '').replace('/think', '').strip() %}"
    "{%- if ns.mode == 'no_think' %}{%- set text = (text + '\\n' if text else '') + 'Reasoning Mode: /no_think' %}{%- endif %}"
    "{%- if text %}{{- '<|im_start|>system\\n' + text + '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if ns.mode == 'no_think' %}{{- '<think>\\n\\n</think>\\n' }}{%- endif %}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, min_frequency: int = 2):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                        pad_token="<|pad|>", unk_token=None,
                                        model_max_length=4096)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
