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
    "{%- set ns = namespace(mode='think', tools='') %}"
    "{%- if enable_thinking is defined and not enable_thinking %}{%- set ns.mode = 'no_think' %}{%- endif %}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- if '/no_think' in messages[0]['content'] %}{%- set ns.mode = 'no_think' %}"
    "{%- elif '/think' in messages[0]['content'] %}{%- set ns.mode = 'think' %}{%- endif %}"
    "{%- endif %}"
    # Tools: one compact line per tool, name(parameters), so a 256-token demo context keeps room for the task
    "{%- if tools %}{%- set ns.tools = '# Tools\\n<tools>' %}{%- for tool in tools %}"
    "{%- set fn = tool['function'] if tool['function'] is defined else tool %}"
    "{%- set params = fn['parameters']['properties'] | list if fn['parameters'] is defined else [] %}"
    "{%- set ns.tools = ns.tools + '\\n' + fn['name'] + '(' + params | join(', ') + ')' %}"
    "{%- endfor %}{%- set ns.tools = ns.tools + '\\n</tools>' %}{%- endif %}"
    "{%- if not (messages and messages[0]['role'] == 'system') and (ns.mode == 'no_think' or ns.tools) %}"
    "{%- set text = ns.tools + ('\\n' if ns.tools and ns.mode == 'no_think' else '')"
    " + ('Reasoning Mode: /no_think' if ns.mode == 'no_think' else '') %}"
    "{{- '<|im_start|>system\\n' + text + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] or '' %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}"
    "{%- if ns.mode == 'no_think' and not content.startswith('<think>') %}"
    "{{- '<think>\\n\\n</think>\\n' }}{%- endif %}"
    "{{- content }}"
    # Tool calls in the Hermes/Qwen JSON format: <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'system' %}"
    "{%- set text = content.replace('/no_think', '').replace('/think', '').strip() %}"
    "{%- if ns.tools %}{%- set text = (text + '\\n' if text else '') + ns.tools %}{%- endif %}"
    "{%- if ns.mode == 'no_think' %}{%- set text = (text + '\\n' if text else '') + 'Reasoning Mode: /no_think' %}{%- endif %}"
    "{%- if text %}{{- '<|im_start|>system\\n' + text + '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if ns.mode == 'no_think' %}{{- '<think>\\n\\n</think>\\n' }}{%- endif %}{%- endif %}"
)

# How transformers' ``tokenizer.parse_response`` (and TRL's tool loop) reads an assistant turn of
# this template back into a message: optional reasoning, Hermes/Qwen JSON tool calls, the text.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, min_frequency: int = 2):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    # Digits one by one, as SmolLM's tokenizers split them: a number reads the same wherever it stands
    # (" 443" and "\"443" share their tokens), so copying it into a tool call is copying tokens.
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False)])
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
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer
