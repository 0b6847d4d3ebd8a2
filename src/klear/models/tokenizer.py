"""The built-in tokenizer: one token per byte, plus the chat and reasoning special tokens.

Real reasoning models use a byte-level BPE with ~150k merged tokens. The embedded default keeps the byte level
and drops every merge: each byte of text is one token, so the vocabulary is 256 bytes plus five special tokens.
That is what a tiny model learning arithmetic wants (every digit is its own token, so carrying is learnable and
"12" and "2" share the token for "2"), it is lossless for any UTF-8 text, and it is built here in milliseconds
with the ``tokenizers`` library instead of being downloaded. The cost is length: text takes ~4x the tokens a
merged vocabulary would, which the synthetic task offsets by keeping its problems and solutions short.

The special tokens and the chat template follow Qwen's layout, so prompts and completions look like real
long-CoT data: ``<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n<think>\\n...\\n</think>\\n\\n...``.
``<|endoftext|>`` pads, ``<|im_end|>`` ends a turn (the eos for generation). ``<think>``/``</think>`` are
single tokens but not "special", so ``decode(..., skip_special_tokens=True)`` keeps them, as Qwen3's tokenizer
does: a reward function must see the reasoning boundary.

Padding is on the left. Generation with a batch of prompts needs it (every row's next token goes at the same
last position), and training loses nothing: the attention mask hides the pads and rotary position encodings only
see relative positions, so a left-padded row gives the same logits on its real tokens as a right-padded one.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
"""Control tokens, removed by ``skip_special_tokens=True``."""
REASONING_TOKENS = (THINK_START, THINK_END)
"""Single tokens that stay in decoded text."""

# Qwen2.5/Qwen3 layout without tools or the `enable_thinking` switch (the model always thinks). The
# {% generation %} block marks the assistant tokens a trainer computes the loss on, so
# `apply_chat_template(..., return_assistant_tokens_mask=True)` works.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role'] + '; expected system, user or assistant') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>' }}"
    "{%- endif %}"
    "{{- '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the byte-level, merge-free tokenizer with its special tokens and chat template.

    Ids 0-255 are the bytes (in GPT-2's byte-to-unicode order), then ``<|endoftext|>``, ``<|im_start|>``,
    ``<|im_end|>``, ``<think>``, ``</think>`` (256-260).
    """
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    # alphabet() is a set; sort by the byte each character stands for so id == byte value.
    order = {chr(c): b for b, c in enumerate(_byte_to_unicode())}
    vocab = {ch: order[ch] for ch in sorted(byte_chars, key=order.__getitem__)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    # Added here, in order, so the ids are fixed before the transformers wrapper sees them.
    core.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(tok, special=False, normalized=False) for tok in REASONING_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        additional_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    _check_layout(tokenizer)
    return tokenizer


def _byte_to_unicode() -> list[int]:
    """GPT-2's printable stand-in code point for each byte 0-255, the order ByteLevel uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = [], 0
    for b in range(256):
        if b in printable:
            codes.append(b)
        else:
            codes.append(256 + extra)
            extra += 1
    return codes


def _check_layout(tokenizer: PreTrainedTokenizerFast) -> None:
    expected = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS + REASONING_TOKENS)}
    actual = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in expected}
    if actual != expected or len(tokenizer) != 261:
        raise RuntimeError(
            f"tokenizer layout changed: special ids {actual}, size {len(tokenizer)}; expected {expected}"
        )
