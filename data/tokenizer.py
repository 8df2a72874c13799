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
# ``enable_thinking`` picks it when the system prompt does not say. A mode picked either way is
# stated in the system turn as SmolLM3's template does ("Reasoning Mode: /think"; the flag itself
# leaves the custom text), so the model can tell the modes apart from the prompt alone. No flag
# and no switch: think mode, rendered byte for byte as plain ChatML (answers as they are; a
# reasoning answer carries its own <think>…</think>). In no-think mode every answer starts with an
# empty think block (inside the trained span) and so does the generation prompt.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(mode='think', stated=false) %}"
    "{%- if enable_thinking is defined %}{%- set ns.stated = true %}"
    "{%- if not enable_thinking %}{%- set ns.mode = 'no_think' %}{%- endif %}{%- endif %}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- if '/no_think' in messages[0]['content'] %}{%- set ns.mode = 'no_think' %}{%- set ns.stated = true %}"
    "{%- elif '/think' in messages[0]['content'] %}{%- set ns.mode = 'think' %}{%- set ns.stated = true %}{%- endif %}"
    "{%- elif ns.stated %}{{- '<|im_start|>system\\nReasoning Mode: /' + ns.mode + '<|im_end|>\\n' }}"
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
    "{%- if ns.stated %}{%- set text = (text + '\\n' if text else '') + 'Reasoning Mode: /' + ns.mode %}{%- endif %}"
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
