"""Loading (offline default, local files, a column, a configuration), the held-out split, packing with EOS,
per-rank sharding and resume (conversations and streamed datasets: tests/hf/test_streaming.py)."""

import json

import pytest
import torch

from zero_train.hf import batches, data, offline, packing
from zero_train.hf import models as hf
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")

BLOCK = 64


@pytest.fixture(scope="module")
def tokenizer():
    return hf.load_tokenizer()


@pytest.fixture(scope="module")
def packed_stdlib(tokenizer):
    return packing.pack_dataset(data.load_text_dataset("stdlib", seed=0), tokenizer, block_size=BLOCK)


def write_docs(folder, docs):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text("\n\n".join(docs[: len(docs) // 2]) + "\n")
    (folder / "b.txt").write_text("\n\n".join(docs[len(docs) // 2 :]) + "\n")


def test_stdlib_split_is_deterministic_disjoint_and_seeded():
    first, again = data.load_text_dataset(), data.load_text_dataset(seed=0)
    other = data.load_text_dataset(seed=1)
    num_files = len(offline.stdlib_files(offline.DEFAULT_CORPUS_BYTES))
    assert len(first["train"]) + len(first["validation"]) == num_files
    assert len(first["validation"]) == -(-num_files * 5 // 100)  # ceil(5%)
    assert list(first["validation"]["text"]) == list(again["validation"]["text"])
    assert set(list(first["validation"]["text"])).isdisjoint(list(first["train"]["text"]))
    assert list(first["validation"]["text"]) != list(other["validation"]["text"])


def test_packing_is_the_eos_joined_token_stream_cut_into_blocks(tmp_path, tokenizer):
    docs = [f"def f{i}(x):\n    return x * {i}  # doc {i}" for i in range(40)]
    write_docs(tmp_path / "corpus", docs)
    dsd = data.load_text_dataset(str(tmp_path / "corpus"), seed=3)
    packed = packing.pack_dataset(dsd, tokenizer, block_size=8)
    for split in ("train", "validation"):
        stream = []
        for text in list(dsd[split]["text"]):
            stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [offline.EOS_TOKEN_ID]
        blocks = list(packed[split]["input_ids"])
        assert all(len(block) == 8 for block in blocks)
        assert [t for block in blocks for t in block] == stream[: len(stream) // 8 * 8]
    loaded = list(dsd["train"]["text"]) + list(dsd["validation"]["text"])
    assert sorted(text.strip() for text in loaded) == sorted(docs)  # one document per paragraph


def test_stdlib_packing_numbers(packed_stdlib):
    train = packed_stdlib["train"]
    assert train.column_names == ["input_ids"]
    assert len(train[0]["input_ids"]) == BLOCK
    assert packing.num_tokens(train) > 500_000  # ~4 MB of source at ~3.6 chars/token
    eos_share = sum(row.count(offline.EOS_TOKEN_ID) for row in train[:2000]["input_ids"]) / (2000 * BLOCK)
    assert 0 < eos_share < 0.01  # one EOS per file


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet"])
def test_local_tabular_files_with_a_text_column(tmp_path, kind):
    import datasets

    rows = [{"text": f"document number {i}", "label": i} for i in range(20)]
    path = tmp_path / f"d.{kind}"
    table = datasets.Dataset.from_list(rows)
    {
        "jsonl": lambda: table.to_json(path),
        "json": lambda: path.write_text(json.dumps(rows)),
        "csv": lambda: table.to_csv(path),
        "parquet": lambda: table.to_parquet(path),
    }[kind]()
    dsd = data.load_text_dataset(str(path), eval_fraction=0.25)
    assert dsd["train"].column_names == ["text"]
    assert (len(dsd["train"]), len(dsd["validation"])) == (15, 5)


def test_bad_datasets_are_usage_errors(tmp_path, tokenizer):
    with pytest.raises(UsageError, match="does not exist"):
        data.load_text_dataset(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UsageError, match="cannot load dataset 'someone/corpus:cfg' .*OFFLINE"):
        data.load_text_dataset("someone/corpus:cfg")  # tests run with HF_DATASETS_OFFLINE=1
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(UsageError, match="is empty"):
        data.load_text_dataset(str(tmp_path / "empty.txt"))
    (tmp_path / "blank.txt").write_text("\n\n   \n\n")
    with pytest.raises(UsageError, match="empty"):
        data.load_text_dataset(str(tmp_path / "blank.txt"))
    (tmp_path / "notext.jsonl").write_text('{"content": "a"}\n{"content": "b"}\n')
    with pytest.raises(UsageError, match="no 'text' column .*content.*--text-column"):
        data.load_text_dataset(str(tmp_path / "notext.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(
        UsageError, match=r"dataset .*broken.jsonl' line 2: not JSON \(Expecting property name"
    ):
        data.load_text_dataset(str(tmp_path / "broken.jsonl"))  # the file and line, not datasets' row
    (tmp_path / "notes.md").write_text("# title\n")
    with pytest.raises(UsageError, match="unsupported file type .md"):
        data.load_text_dataset(str(tmp_path / "notes.md"))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("a\n\nb")
    (tmp_path / "mixed" / "b.csv").write_text("text\nc\n")
    with pytest.raises(UsageError, match="mixes csv and text files"):
        data.load_text_dataset(str(tmp_path / "mixed"))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(UsageError, match="has no txt"):
        data.load_text_dataset(str(tmp_path / "nothing"))
    (tmp_path / "one.txt").write_text("a single paragraph")
    with pytest.raises(UsageError, match="at least 2"):
        data.load_text_dataset(str(tmp_path / "one.txt"))
    (tmp_path / "short.txt").write_text("a\n\nb\n\nc\n")
    with pytest.raises(UsageError, match="fewer than --block-size 64"):
        packing.pack_dataset(data.load_text_dataset(str(tmp_path / "short.txt")), tokenizer, block_size=64)


def test_ranks_read_disjoint_shards_whose_union_is_the_single_rank_order(packed_stdlib):
    train = packed_stdlib["train"]
    world, micro = 2, 3
    per_rank = [
        batches.rank_batches(train, rank=r, world_size=world, micro_batch_size=micro, seed=5)
        for r in range(2)
    ]
    single = batches.rank_batches(train, rank=0, world_size=1, micro_batch_size=micro * world, seed=5)
    seen = []
    for _ in range(4):
        parts = [next(it)["input_ids"] for it in per_rank]
        assert all(p.shape == (micro, BLOCK) and p.dtype == torch.long for p in parts)
        assert torch.equal(torch.cat(parts), next(single)["input_ids"])
        seen += [tuple(row.tolist()) for p in parts for row in p]
    assert len(set(seen)) == len(seen)


def test_resume_and_epochs(packed_stdlib):
    train = packed_stdlib["train"].select(range(10))  # 10 blocks, 2 ranks x 2 -> 2 micro-steps per epoch
    kwargs = dict(rank=1, world_size=2, micro_batch_size=2, seed=7)
    assert batches.steps_per_epoch(train, world_size=2, micro_batch_size=2) == 2
    stream = batches.rank_batches(train, **kwargs)
    first = [next(stream)["input_ids"] for _ in range(6)]  # three epochs
    resumed = batches.rank_batches(train, start_step=3, **kwargs)
    assert all(torch.equal(a, next(resumed)["input_ids"]) for a in first[3:])
    assert all(
        torch.equal(a, b["input_ids"])
        for a, b in zip(first[2:4], batches.rank_batches(train, epoch=1, **kwargs), strict=False)
    )
    assert not torch.equal(torch.cat(first[:2]), torch.cat(first[2:4]))  # reshuffled per epoch
    with pytest.raises(UsageError, match="fewer than one global micro-batch"):
        next(batches.rank_batches(train, rank=0, world_size=4, micro_batch_size=3, seed=0))


def _prepare_on_rank(rank, world_size, good, bad):
    from zero_train.hf import data
    from zero_train.hf import models as hf

    packed = data.prepare_datasets(good, hf.load_tokenizer(), block_size=16, seed=0)
    try:
        data.prepare_datasets(bad, hf.load_tokenizer(), block_size=16, seed=0)
    except UsageError as err:
        return list(packed["train"]["input_ids"]), str(err)
    return list(packed["train"]["input_ids"]), None


@pytest.mark.tier("multiproc")
def test_prepare_datasets_rank0_first_and_errors_reach_every_rank(tmp_path, rank_pool):
    write_docs(tmp_path / "ok", [f"paragraph {i} " * 5 for i in range(10)])
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n{"body": "y"}\n')
    (blocks, error), (blocks_other, error_other) = rank_pool(2).run(
        _prepare_on_rank, (str(tmp_path / "ok"), str(tmp_path / "bad.jsonl"))
    )
    assert blocks == blocks_other and len(blocks) > 0
    assert error == error_other and "no 'text' column" in error


def test_another_text_column_and_a_configuration_of_a_local_clone(tmp_path):
    rows = [{"body": f"document number {i}", "text": ""} for i in range(20)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(UsageError, match="is empty \\(no non-blank 'text' values\\)"):
        data.load_text_dataset(str(tmp_path / "d.jsonl"))  # the default column is there, but blank
    dsd = data.load_text_dataset(str(tmp_path / "d.jsonl"), column="body", eval_fraction=0.25)
    assert dsd["train"].column_names == ["text"] and len(dsd["train"]) == 15
    assert sorted([*dsd["train"]["text"], *dsd["validation"]["text"]]) == sorted(row["body"] for row in rows)
    # a hub dataset's repository as `git clone` leaves it: README.md names the configs
    clone = tmp_path / "clone"
    clone.mkdir()
    for name, count in (("small", 4), ("large", 12)):
        (clone / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": f"{name} {i}"}) + "\n" for i in range(count))
        )
    (clone / "README.md").write_text(
        "---\nconfigs:\n- config_name: small\n  data_files: small.jsonl\n"
        "- config_name: large\n  data_files: large.jsonl\n---\n"
    )
    small = data.load_text_dataset(str(clone), config_name="small", eval_fraction=0.25)
    large = data.load_text_dataset(str(clone), config_name="large", eval_fraction=0.25)
    assert (len(small["train"]), len(large["train"])) == (3, 9)
    assert all(text.startswith("large") for text in large["train"]["text"])
    with pytest.raises(UsageError, match="names configuration 'a' but --dataset-config 'b'"):
        data.load_text_dataset("owner/set:a", config_name="b")
