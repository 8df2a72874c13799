"""Byte-level BPE tokenizers trained on the fly, with a ChatML template TRL can mask.

The assistant turn sits inside ``{% generation %}…{% endgeneration %}`` so TRL's
``assistant_only_loss`` finds the tokens to train on. ``<|im_end|>`` is the EOS token (it ends
every assistant turn, so generation stops there); ``<|endoftext|>`` separates pretraining
documents; ``<|pad|>`` pads.

    >>> tok = train_tokenizer(["Zorblax likes the color red."] * 50, vocab_size=300)
    >>> tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
    ...                         add_generation_prompt=True)
    '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
"""
from __future__ import annotations

from collections.abc import Iterable

DOC_SEPARATOR = "<|endoftext|>"
SPECIAL_TOKENS = [DOC_SEPARATOR, "<|im_start|>", "<|im_end|>", "<|pad|>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
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
