"""Conversations (--sft): the labels cover the assistant turns only, with the offline template and a chat template;
packing keeps the mask. Streamed datasets (--streaming): each rank's share, the held-out documents, and a read
position that resumes with the same tokens in the same order, across epochs."""

import json
import zlib

import datasets
import pytest
import torch

from zero_train.hf import chat, data, packing, streaming
from zero_train.hf import models as hf
from zero_train.runtime.errors import UsageError

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 3 plus 4?"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "And 5 plus 5?"},
    {"role": "assistant", "content": "It is 10."},
]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def tokenizer():
    return hf.load_tokenizer()


def _supervised(ids, labels, tokenizer) -> str:
    assert len(ids) == len(labels) and all(
        label in (chat.IGNORE_INDEX, i) for i, label in zip(ids, labels, strict=True)
    )
    return tokenizer.decode([label for label in labels if label != chat.IGNORE_INDEX])


def test_the_offline_template_supervises_the_answers_and_their_eos(tokenizer):
    ids, labels = chat.encode_conversation(CONVERSATION, tokenizer)
    assert tokenizer.decode(ids) == (
        "system: Be brief.\nuser: What is 3 plus 4?\nassistant: 7<|endoftext|>\nuser: And 5 plus 5?\n"
        "assistant: It is 10.<|endoftext|>"
    )
    assert _supervised(ids, labels, tokenizer) == " 7<|endoftext|> It is 10.<|endoftext|>"


def test_a_chat_template_supervises_the_assistant_turns_and_appends_eos(tokenizer):
    tokenizer.chat_template = CHATML
    ids, labels = chat.encode_conversation(CONVERSATION, tokenizer)
    assert _supervised(ids, labels, tokenizer) == "7<|im_end|>\nIt is 10.<|im_end|>\n"
    assert (
        ids[-1] == tokenizer.eos_token_id and labels[-1] == chat.IGNORE_INDEX
    )  # the separator is not learned


def test_a_template_that_rewrites_earlier_turns_and_bad_rows_are_one_line(tokenizer):
    tokenizer.chat_template = "{{ messages[-1]['content'] }}"  # each render drops what came before
    with pytest.raises(UsageError, match="renders earlier turns differently"):
        chat.encode_conversation(CONVERSATION, tokenizer)
    for row, needle in [("just text", "non-empty list"), ([{"role": "user"}], "'role' and a 'content'")]:
        with pytest.raises(UsageError, match=needle):
            chat.encode_conversation(row, tokenizer)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_conversations_from_local_files_pack_with_their_mask(tmp_path, tokenizer, kind):
    rows = [
        {"id": i, "conversation": [{"role": "user", "content": f"add {i} and {i + 1}"},
                                   {"role": "assistant", "content": f"{2 * i + 1}"}]}
        for i in range(60)
    ]  # fmt: skip
    path = tmp_path / f"chats.{kind}"
    table = datasets.Dataset.from_list(rows)
    table.to_json(path) if kind == "jsonl" else table.to_parquet(path)
    with pytest.raises(UsageError, match="no 'messages' column .*conversation.*--text-column"):
        data.load_text_dataset(str(path), chat=True)
    dsd = data.load_text_dataset(str(path), chat=True, column="conversation", eval_fraction=0.1)
    assert dsd["train"].column_names == [chat.MESSAGES_COLUMN] and len(dsd["validation"]) == 6
    packed = packing.pack_dataset(dsd, tokenizer, block_size=16)
    train = packed["train"]
    assert train.column_names == ["input_ids", "labels"]
    for ids, labels in zip(train["input_ids"], train["labels"], strict=True):
        assert any(label != chat.IGNORE_INDEX for label in labels[1:])  # blocks without an answer are dropped
        assert all(label in (chat.IGNORE_INDEX, i) for i, label in zip(ids, labels, strict=True))
    batch = next(packing.rank_batches(train, rank=0, world_size=1, micro_batch_size=2, seed=0))
    assert batch["labels"].shape == batch["input_ids"].shape == (2, 16)
    supervised = tokenizer.decode([label for labels in train["labels"] for label in labels if label != -100])
    assert supervised.count("<|endoftext|>") >= 40 and "add" not in supervised  # answers, never the prompts


def _write_docs(path, count: int) -> list[str]:
    docs = [f"document {i}: " + " ".join(f"w{i}x{j}" for j in range(i % 7 + 3)) for i in range(count)]
    path.write_text("".join(json.dumps({"body": doc, "n": i}) + "\n" for i, doc in enumerate(docs)))
    return docs


def _take(stream, batches: int) -> list[torch.Tensor]:
    return [stream.next_batch(2)["input_ids"] for _ in range(batches)]


def test_a_streamed_dataset_resumes_with_the_same_tokens_across_epochs(tmp_path, tokenizer):
    docs = _write_docs(tmp_path / "docs.jsonl", 40)
    opened = dict(block_size=16, seed=3, rank=0, world_size=1, eval_blocks=4, column="body")
    with pytest.raises(UsageError, match="no 'text' column .*body"):
        streaming.prepare_streams(str(tmp_path / "docs.jsonl"), tokenizer, **{**opened, "column": None})
    streams = streaming.prepare_streams(str(tmp_path / "docs.jsonl"), tokenizer, **opened)
    tokens_per_epoch = sum(
        len(tokenizer(doc)["input_ids"]) + 1 for doc in docs if not streaming._held_out(doc)
    )
    whole = _take(streams.train, 3)
    position = streams.train.state()
    whole += _take(streams.train, 2 * tokens_per_epoch // 32)  # on into the third epoch
    assert streams.train.epoch == 2
    again = streaming.prepare_streams(str(tmp_path / "docs.jsonl"), tokenizer, **opened).train.resumed(
        position
    )
    rest = _take(again, len(whole) - 3)
    assert all(torch.equal(a, b) for a, b in zip(whole[3:], rest, strict=True))
    first_epoch = [t for batch in whole[: tokens_per_epoch // 32] for t in batch.flatten().tolist()]
    second_epoch = [t for batch in whole[tokens_per_epoch // 32 : 2 * (tokens_per_epoch // 32)]
                    for t in batch.flatten().tolist()]  # fmt: skip
    assert first_epoch != second_epoch  # reshuffled per epoch


def test_streamed_shares_are_disjoint_and_the_held_out_documents_never_trained_on(tmp_path, tokenizer):
    docs = _write_docs(tmp_path / "docs.jsonl", 60)
    held = {doc for doc in docs if zlib.crc32(repr(doc).encode()) % streaming.HELD_OUT_EVERY == 0}
    assert 0 < len(held) < 10
    shares = []
    for rank in range(2):
        streams = streaming.prepare_streams(str(tmp_path / "docs.jsonl"), tokenizer, block_size=8, seed=0, rank=rank,
                                            world_size=2, eval_blocks=1000, column="body")  # fmt: skip
        streams.train.dataset.set_epoch(0)
        shares.append([row["text"] for row in streams.train.dataset])
        held_tokens = [t for ids in streams.validation["input_ids"] for t in ids]
        expected = [t for doc in docs if doc in held for t in tokenizer(doc)["input_ids"] + [0]]
        assert held_tokens == expected[: len(held_tokens)] and len(expected) - len(held_tokens) < 8
    assert set(shares[0]).isdisjoint(shares[1]) and abs(len(shares[0]) - len(shares[1])) <= 1
    assert sorted(shares[0] + shares[1]) == sorted(set(docs) - held)
