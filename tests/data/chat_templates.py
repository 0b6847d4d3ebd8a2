"""Chat templates written for the tests, each behaving like a family of real ones (the real templates are not
copied here): the rules are the ones those templates follow, on the tiny tokenizer's special tokens."""

from klear.models.tokenizer import build_tokenizer

QWEN3_STYLE = (
    # Qwen3's rules: an assistant turn's reasoning is its `reasoning_content`, else what its content holds before
    # `</think>`; it is rendered (in <think> tags, an empty block when there is none) only for the turns after the
    # last user message, so earlier turns lose theirs once a later user turn follows.
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set answer = m.content -%}"
    "{%- set thought = m.reasoning_content if m.reasoning_content is defined and m.reasoning_content is not none "
    "else '' -%}"
    "{%- if not thought and '</think>' in answer -%}"
    "{%- set thought = answer.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set answer = answer.split('</think>')[-1] -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_user -%}{{- '<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- answer.lstrip('\\n') + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

HARMONY_STYLE = (
    # gpt-oss' rules, in the tiny tokenizer's tokens: a developer role of its own, and an assistant `thinking` key
    # rendered before the final answer.
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\\n' -}}"
    "{%- if m.role == 'assistant' and m.thinking is defined -%}{{- 'analysis: ' + m.thinking + '\\nfinal: ' -}}"
    "{%- endif -%}"
    "{{- m.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tokenizer_with(template: str):
    """The tiny tokenizer with ``template`` as its chat template."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    return tokenizer
