"""Conversations (--sft): the labels are -100 on every prompt token and the ids themselves on the assistant turns
(checked token by token), with the offline template and a chat template; packing keeps the mask. Streamed datasets
(--streaming): the same documents as a whole load, read lazily, each rank's share, the held-out documents, and a
read position that resumes with the same tokens in the same order, across epochs."""

import json
import zlib

import datasets
import pytest
import torch

from zero_train.hf import batches, chat, data, packing, streaming
from zero_train.hf import models as hf
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")

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


def _expected(tokenizer, pieces: list[tuple[str, bool]], eos_label: int) -> tuple[list[int], list[int]]:
    """The ids of each piece of text tokenized alone, labelled with themselves where supervised, else -100;
    then the EOS that ends the conversation (labelled eos_label)."""
    ids, labels = [], []
    for text, supervised in pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if supervised else [-100] * len(piece)
    return ids + [tokenizer.eos_token_id], labels + [eos_label]


def test_the_offline_template_supervises_the_answers_and_their_eos(tokenizer):
    ids, labels = chat.encode_conversation(CONVERSATION, tokenizer)
    assert tokenizer.decode(ids) == (
        "system: Be brief.\nuser: What is 3 plus 4?\nassistant: 7<|endoftext|>\nuser: And 5 plus 5?\n"
        "assistant: It is 10.<|endoftext|>"
    )
    assert _supervised(ids, labels, tokenizer) == " 7<|endoftext|> It is 10.<|endoftext|>"
    pieces = [("system: Be brief.\nuser: What is 3 plus 4?\nassistant:", False), (" 7", True),
              ("<|endoftext|>", True), ("\nuser: And 5 plus 5?\nassistant:", False), (" It is 10.", True)]  # fmt: skip
    assert (ids, labels) == _expected(tokenizer, pieces, eos_label=tokenizer.eos_token_id)
    assert labels.count(-100) == len(ids) - 7  # every prompt token: " 7", EOS, " It", " is", " 10", ".", EOS


def test_a_chat_template_supervises_the_assistant_turns_and_appends_eos(tokenizer):
    tokenizer.chat_template = CHATML
    ids, labels = chat.encode_conversation(CONVERSATION, tokenizer)
    assert _supervised(ids, labels, tokenizer) == "7<|im_end|>\nIt is 10.<|im_end|>\n"
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 3 plus 4?<|im_end|>\n"
    pieces = [(prompt + "<|im_start|>assistant\n", False), ("7<|im_end|>\n", True),
              ("<|im_start|>user\nAnd 5 plus 5?<|im_end|>\n<|im_start|>assistant\n", False),
              ("It is 10.<|im_end|>\n", True)]  # fmt: skip
    assert (ids, labels) == _expected(tokenizer, pieces, eos_label=-100)
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
    batch = next(batches.rank_batches(train, rank=0, world_size=1, micro_batch_size=2, seed=0))
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


def _write_source(root, kind: str) -> tuple[str, dict]:
    """A dataset of one kind with blank rows and another column: (spec, load_text_dataset keyword arguments)."""
    docs = [f"doc {i} " + "tok " * (i % 5) if i % 9 else "   " for i in range(80)]  # every 9th blank
    if kind == "txt":
        (root / "a.txt").write_text("\n\n".join(docs[:40]) + "\n")
        (root / "b.txt").write_text("\n\n".join(docs[40:]) + "\n")
        return str(root), {}
    rows = [{"body": doc, "n": i} for i, doc in enumerate(docs)]
    if kind == "csv":
        datasets.Dataset.from_list(rows).to_csv(root / "d.csv")
        return str(root / "d.csv"), {"column": "body"}
    clone = root / "clone"  # a hub dataset's repository cloned: README.md names its configurations
    clone.mkdir()
    (clone / "other.jsonl").write_text(json.dumps({"body": "not this configuration", "n": -1}) + "\n")
    (clone / "main.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (clone / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files: main.jsonl\n"
                                     "- config_name: other\n  data_files: other.jsonl\n---\n")  # fmt: skip
    return str(clone), {"column": "body", "config_name": "main"}


@pytest.mark.parametrize("kind", ["txt", "csv", "clone"])
def test_a_stream_reads_the_rows_a_whole_load_reads(tmp_path, tokenizer, kind):
    spec, kwargs = _write_source(tmp_path, kind)
    whole = data.load_text_dataset(spec, eval_fraction=0.25, **kwargs)
    documents = [*whole["train"]["text"], *whole["validation"]["text"]]
    assert len(documents) == 80 - 9  # blank rows dropped, the other configuration never read
    streams = streaming.prepare_streams(spec, tokenizer, block_size=8, seed=1, rank=0, world_size=1,
                                        eval_blocks=1000, **kwargs)  # fmt: skip
    streams.train.dataset.set_epoch(0)
    streamed = [row["text"] for row in streams.train.dataset]
    held = [doc for doc in documents if streaming._held_out(doc)]
    assert sorted(streamed + held) == sorted(documents) and 0 < len(held) < len(documents) // 4
    held_in_file_order = [doc for doc in sorted(documents, key=lambda d: int(d.split()[1])) if doc in held]
    expected = [
        t for doc in held_in_file_order for t in tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id]
    ]
    held_tokens = [t for ids in streams.validation["input_ids"] for t in ids]
    assert (
        held_tokens == expected[: len(held_tokens)] and len(expected) - len(held_tokens) < 8
    )  # whole blocks


def test_a_stream_trains_on_a_file_whose_end_it_has_not_read(tmp_path, tokenizer):
    """Lazily: an 11 MB JSON Lines file whose last line is broken streams its first blocks (datasets reads 10 MiB
    chunks), while loading it whole fails on that line."""
    with open(tmp_path / "big.jsonl", "w") as out:
        out.writelines(json.dumps({"body": f"document {i}: " + "word " * 16}) + "\n" for i in range(100_000))
        out.write('{"body": "a line cut off\n')
    with pytest.raises(UsageError, match=r"dataset .*big.jsonl' line 100001: not JSON \(Unterminated string"):
        data.load_text_dataset(str(tmp_path / "big.jsonl"), column="body")
    streams = streaming.prepare_streams(str(tmp_path / "big.jsonl"), tokenizer, block_size=16, seed=0, rank=0,
                                        world_size=1, eval_blocks=2, column="body")  # fmt: skip
    batch = streams.train.next_batch(4)
    assert (
        batch["input_ids"].shape == (4, 16) and streams.train.documents < 20
    )  # read as the blocks need them
