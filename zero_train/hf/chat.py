"""Conversations for supervised fine-tuning (--sft): rendered as text, tokenized, labels only on assistant turns.

    ids, labels = encode_conversation([{"role": "user", "content": "2+2?"},
                                       {"role": "assistant", "content": "4"}], tokenizer)
    # labels[i] == ids[i] on the assistant's tokens, IGNORE_INDEX (-100) on everything else

A tokenizer with a chat template (`tokenizer.chat_template`, e.g. Llama 3's or Qwen's) renders the conversation
through `apply_chat_template`; one without (the offline stdlib-bpe) through SIMPLE_TEMPLATE:

    user: 2+2?
    assistant: 4<|endoftext|>

one `role: content` line per message, the assistant's content followed by the EOS token, so that the model
learns where its answer ends. Assistant turn k is located by rendering the conversation up to it with the
generation prompt (`assistant: `, or the template's own) and up to its end: the characters between the two are
the turn, and a token is supervised when it overlaps them. A template that rewrites earlier turns when a later
one is added (the renders are not prefixes of each other) cannot be masked this way: that is a one-line error.
"""

from __future__ import annotations

from zero_train.runtime.errors import UsageError

MESSAGES_COLUMN = "messages"
IGNORE_INDEX = -100
"""The label torch's cross entropy (and so every HF causal LM's loss) skips."""
SIMPLE_TEMPLATE = "'role: content' per line, the assistant's content followed by EOS"
"""The template of a tokenizer without its own (described in words in the module docstring)."""


def encode_conversation(messages, tokenizer) -> tuple[list[int], list[int]]:
    """Token ids and labels of one conversation (labels: IGNORE_INDEX outside the assistant turns).

    Args:
        messages: a list of {"role": str, "content": str} (a dataset row's "messages").
        tokenizer: a fast transformers tokenizer (offsets are needed to map characters to tokens).

    Returns:
        (ids, labels) of the same length; an EOS with label IGNORE_INDEX is appended unless the rendering
        already ends with it (it separates packed conversations).
    """
    messages = _checked(messages)
    text, spans = render_with_spans(messages, tokenizer)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    ids = list(encoded["input_ids"])
    labels = [
        token
        if any(start < end_char and end > start_char for start_char, end_char in spans)
        else IGNORE_INDEX
        for token, (start, end) in zip(ids, encoded["offset_mapping"], strict=True)
    ]
    if not ids or ids[-1] != tokenizer.eos_token_id:
        ids.append(tokenizer.eos_token_id)
        labels.append(IGNORE_INDEX)
    return ids, labels


def render_with_spans(messages: list[dict], tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """The conversation as text and the character spans [start, end) of its assistant turns."""
    text = render(messages, tokenizer)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:index], tokenizer, generation_prompt=True)
        after = render(messages[: index + 1], tokenizer)
        if not (after.startswith(before) and text.startswith(after)):
            raise UsageError(
                f"the chat template of {getattr(tokenizer, 'name_or_path', 'the tokenizer')!r} renders earlier "
                "turns differently once a later one is added, so --sft cannot tell the assistant's tokens apart; "
                "use a tokenizer whose template only appends (--tokenizer)"
            )
        spans.append((len(before), len(after)))
    return text, spans


def render(messages: list[dict], tokenizer, *, generation_prompt: bool = False) -> str:
    """The text of `messages`: the tokenizer's chat template, else SIMPLE_TEMPLATE."""
    if getattr(tokenizer, "chat_template", None):
        if not messages:  # some templates fail on an empty conversation; its rendering is the prompt alone
            return ""
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
    lines = [
        f"{m['role']}: {m['content']}" + (tokenizer.eos_token if m["role"] == "assistant" else "")
        for m in messages
    ]
    if generation_prompt:
        lines.append("assistant: ")
    return "\n".join(lines)


def _checked(messages) -> list[dict]:
    """The messages as a list of {role, content} strings (UsageError naming what is wrong)."""
    if not isinstance(messages, list) or not messages:
        raise UsageError(
            f"--sft: a row's {MESSAGES_COLUMN!r} must be a non-empty list of {{role, content}} messages, "
            f"got {str(messages)[:80]!r}"
        )
    for message in messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            raise UsageError(
                f"--sft: each message needs a 'role' and a 'content' string, got {str(message)[:80]!r}"
            )
        if not isinstance(message.get("content"), str):
            raise UsageError(
                f"--sft: each message needs a 'role' and a 'content' string, got {str(message)[:80]!r}"
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]
