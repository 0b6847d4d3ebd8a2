"""Examples held compactly: the same lists back, the same digest, 5 bytes a token, and labels checked on the way in."""

import numpy as np
import pytest

from klear.data.example_store import IGNORE_INDEX, Examples, ExampleSets
from klear.data.problems import content_digest
from klear.data.sft import build_sft_examples
from klear.data.synthetic import generate_problems, sft_rows
from klear.models.tokenizer import build_tokenizer

X = IGNORE_INDEX
DICTS = [
    {"input_ids": [151643, 7, 151644, 2**31 - 1], "labels": [X, X, 151644, 2**31 - 1]},
    {"input_ids": [5], "labels": [X]},
    {"input_ids": [0, 1, 2], "labels": [0, 1, 2]},
]


def test_indexing_gives_back_the_lists_put_in():
    examples = Examples(DICTS)
    assert len(examples) == 3
    assert [examples[i] for i in range(3)] == DICTS
    assert list(examples) == DICTS
    assert examples[-1] == DICTS[-1]
    assert examples.lengths() == [4, 1, 3]
    assert examples.tokens == 8
    with pytest.raises(IndexError, match="example 3 of 3"):
        examples[3]
    assert isinstance(examples[1:], Examples) and list(examples[1:]) == DICTS[1:]
    assert list(examples[::-2]) == DICTS[::-2]
    with pytest.raises(TypeError, match="indexed by int or slice"):
        examples["0"]


def test_extend_by_examples_or_dicts_keeps_order_and_offsets():
    joined = Examples(DICTS[:1])
    joined += Examples(DICTS[1:])
    other = Examples()
    other.extend(DICTS)
    assert list(joined) == list(other) == DICTS
    joined.extend(Examples())
    assert list(joined) == DICTS


def test_five_bytes_a_token_and_eight_an_example():
    examples = Examples(DICTS)
    assert examples.nbytes == 8 * 5 + (3 + 1) * 8


@pytest.mark.parametrize(
    "example, why",
    [
        ({"input_ids": [1, 2, 3], "labels": [X, 2, 4]}, "neither its token's id nor IGNORE_INDEX"),
        ({"input_ids": [1, 2, 3], "labels": [X, 2]}, "3 tokens and 2 labels"),
    ],
)
def test_a_label_other_than_its_token_or_ignore_is_refused(example, why):
    examples = Examples(DICTS)
    with pytest.raises(ValueError, match=why):
        examples.append(example)
    assert list(examples) == DICTS  # nothing half-added


@pytest.mark.parametrize("dicts", [DICTS, DICTS[:1], []])
def test_digest_is_the_content_digest_of_the_dicts(dicts):
    assert Examples(dicts).digest() == content_digest(dicts)


def test_built_examples_are_the_encoder_lists_with_the_same_digest():
    tokenizer = build_tokenizer()
    rows = sft_rows(generate_problems(12, seed=3), 0.5, seed=3)
    examples, stats = build_sft_examples(rows, tokenizer, max_length=200)
    assert isinstance(examples, Examples) and len(examples) == stats.examples == 12
    first = examples[0]
    assert X in first["labels"] and any(label != X for label in first["labels"])
    assert all(label in (token, X) for token, label in zip(first["input_ids"], first["labels"], strict=True))
    assert examples.digest() == content_digest(list(examples))
    assert examples.nbytes == 5 * examples.tokens + 8 * (len(examples) + 1)


def test_mapped_examples_read_as_held_ones_and_refuse_changes(tmp_path):
    """Arrays kept as given (``copy=False``; memory-mapped here, as a cache entry is): the same dicts, lengths and
    digest, read-only; copied into an ``Examples()`` they change as any."""
    held = Examples(DICTS)
    maps = []
    for name, array in zip(("ids", "learned", "starts"), held.arrays(), strict=True):
        array.tofile(tmp_path / name)
        maps.append(np.memmap(tmp_path / name, dtype=array.dtype, mode="r", shape=array.shape))
    mapped = Examples.from_arrays(*maps, copy=False)
    assert mapped.mapped and not held.mapped
    assert list(mapped) == DICTS and mapped[-1] == DICTS[-1] and list(mapped[1:]) == DICTS[1:]
    assert mapped.lengths() == [4, 1, 3] and all(type(length) is int for length in mapped.lengths())
    assert (mapped.tokens, mapped.nbytes, mapped.digest()) == (held.tokens, held.nbytes, held.digest())
    assert [array.filename for array in mapped.arrays()] == [tmp_path / name for name in ("ids", "learned", "starts")]
    with pytest.raises(TypeError, match="mapped examples are read-only"):
        mapped.append(DICTS[0])
    with pytest.raises(TypeError, match="mapped examples are read-only"):
        mapped += held
    copy = Examples()
    copy += mapped
    copy.append(DICTS[1])
    assert list(copy) == [*DICTS, DICTS[1]] and not copy.mapped
    with pytest.raises(ValueError, match="1-d int32 ids"):
        Examples.from_arrays(maps[0].astype(np.int64), maps[1], maps[2], copy=False)


def test_example_sets_index_every_set_in_order_without_copying_them():
    first, second = Examples(DICTS), Examples(DICTS[::-1] + DICTS[:1])
    sets = ExampleSets([first, second])
    expected = [*DICTS, *DICTS[::-1], DICTS[0]]
    assert len(sets) == 7 and [sets[index] for index in range(7)] == expected and sets[-4] == expected[-4]
    assert sets.lengths() == [4, 1, 3, 3, 1, 4, 4] and sets.tokens == first.tokens + second.tokens
    assert sets.parts[0] is first and sets.parts[1] is second
    with pytest.raises(IndexError, match="example 7 of 7"):
        sets[7]
    assert len(ExampleSets([])) == 0
