"""What tokenizing SFT data costs in time, one row at a time vs in batches, and in memory, held as Python lists (the
form tokenizers return) vs `Examples`.

Rows are long-CoT chat conversations (a question, ``<think>`` reasoning of log-normal length around
``--tokens`` tokens, a boxed answer) in words drawn from a Zipf law, tokenized by a byte-level BPE tokenizer trained
here with a real model's vocabulary size (``--vocab``, 151,936 for Qwen; nothing is downloaded) and the tiny model's
chat template. The tiny tokenizer would hide the cost: its ids are below 257, which Python keeps as shared ints.

It first times the tokenization of the rows two ways: each row rendered and tokenized alone (``Encoder.encode``,
one call to the tokenizer per text), and `build_sft_examples`, which renders a batch of rows and tokenizes its texts
in one call (a fast tokenizer spreads a batch over the cores). Both must give the same examples. Then what a start
costs once the set is kept in ``data.cache_dir`` (`klear.data.sft_cache`): the rows hashed into the entry's key and
the entry read and checked, against tokenizing in batches, and the memory the set read back holds (traced
allocations), memory-mapped as klear reads it and copied into memory; then, for the rows written to a jsonl file
and loaded as a run loads them, the next start that finds the set by the file's rows against one that finds it by
the file's stamp without reading it.

For both forms of the examples it prints the bytes a token takes (traced allocations of the whole set), the time
to build a batch from it (`klear.data.packing.collate`) and to compute the set's ``data_report.json`` digest with
the peak memory that takes, each with the ratio lists / `Examples`, measured in the same run.

    python tools/bench_sft_data.py [--rows 400] [--tokens 3000] [--vocab 151936]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import string
import tempfile
import time
import tracemalloc

from klear.data.example_store import Examples
from klear.data.packing import collate
from klear.data.problems import content_digest
from klear.data.sft import Encoder, SFTStats, build_sft_examples, file_layout
from klear.data.sft_cache import tokenized_set
from klear.data.sft_layouts import read_conversation
from klear.models.tokenizer import build_tokenizer


def words(count: int, rng: random.Random) -> list[str]:
    return ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 11))) for _ in range(count)]


def conversations(rows: int, tokens: int, seed: int) -> list[dict]:
    """Chat rows whose reasoning runs about ``tokens`` words (log-normal, sigma 0.5), Zipf-distributed."""
    rng = random.Random(seed)
    vocabulary = words(50_000, rng)
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    out = []
    for index in range(rows):
        length = max(16, round(math.exp(rng.gauss(math.log(tokens), 0.5))))
        reasoning = " ".join(rng.choices(vocabulary, weights, k=length))
        question = " ".join(rng.choices(vocabulary, weights, k=40))
        answer = f"<think>\n{reasoning}\n</think>\n\nThe answer is \\boxed{{{index}}}."
        out.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    return out


def trained_tokenizer(texts: list[str], vocab: int):
    """A byte-level BPE tokenizer of ``vocab`` ids trained on ``texts``, with the tiny model's chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tiny = build_tokenizer()
    specials = [tiny.pad_token, "<|im_start|>", tiny.eos_token, "<think>", "</think>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=tiny.pad_token, eos_token=tiny.eos_token, model_max_length=10**9
    )
    tokenizer.chat_template = tiny.chat_template
    return tokenizer


def kept_and_read(rows: list[dict], tokenizer, built: Examples) -> tuple[float, float, int, int, int]:
    """Seconds to keep ``built`` in a ``data.cache_dir`` (`tokenized_set`, the rows hashed into its key) and to read
    it back at the next start, the entry's bytes, and the memory the set read back holds (traced allocations; a
    mapped file's pages are the page cache's, shared by every process that maps it): mapped (as klear reads it) and
    copied into memory; asserts the examples read back are ``built``."""
    lines = list(range(1, len(rows) + 1))
    key = {"source": "bench", "max_length": 10**9}
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        kept = tokenized_set(folder, key, rows, lines, tokenizer, lambda: (built, SFTStats()), "bench")
        kept_s = time.perf_counter() - started
        started = time.perf_counter()
        tokenized_set(folder, key, rows, lines, tokenizer, lambda: None, "bench")
        read_s = time.perf_counter() - started
        # read again under tracemalloc, which would slow the timed read
        read, mapped, _ = traced(lambda: tokenized_set(folder, key, rows, lines, tokenizer, lambda: None, "bench"))
        held, copied, _ = traced(lambda: Examples.from_arrays(*read.examples.arrays()))
        assert read.examples.mapped and read.digest == kept.digest  # kept's is built's, computed as it was kept
        for array, same, other in zip(read.examples.arrays(), built.arrays(), held.arrays(), strict=True):
            assert array.tobytes() == same.tobytes() == other.tobytes()
        return kept_s, read_s, read.read_from.stat().st_size, mapped, copied


def found_by_stamp(rows: list[dict], tokenizer) -> tuple[float, int, float, int]:
    """A start that finds the set kept for a data file, through the function a run loads its sets with
    (`klear.data.sft_sets.sft_set`): by its rows (the file read, parsed and hashed into the entry's key) and by the
    file's stamp (`klear.data.sft_cache.known_set`, the file not read); the seconds and the peak of traced
    allocations of each. Asserts both give the report of the start that tokenized the set."""
    from omegaconf import OmegaConf

    from klear.config.load import load_config
    from klear.data import sft_cache
    from klear.data.readers import write_jsonl
    from klear.data.sft_sets import sft_set

    sft_cache.RACY_S = 0.0  # the file was written a moment ago; a run finds it by its stamp 2 s after that
    with tempfile.TemporaryDirectory() as folder:
        source = str(write_jsonl(rows, os.path.join(folder, "rows.jsonl")))
        overrides = ["stage=sft", f"data.train={source}", f"data.cache_dir={folder}", f"data.max_length={10**9}"]
        config = OmegaConf.to_object(load_config(None, overrides))
        _, report = sft_set(config, source, "", tokenizer)  # tokenized, kept, and its file's stamp noted
        notes = [name for name in os.listdir(folder) if name.endswith(".json")]
        assert len(notes) == 1
        results = []
        for by in ("rows", "stamp"):
            if by == "rows":
                os.remove(os.path.join(folder, notes[0]))  # no note: found by its rows, and noted again
            started = time.perf_counter()
            sft_set(config, source, "", tokenizer)
            seconds = time.perf_counter() - started
            if by == "rows":
                os.remove(os.path.join(folder, notes[0]))
            (_, again), _, peak = traced(lambda: sft_set(config, source, "", tokenizer))  # untimed: tracing slows
            assert again == report
            results += [seconds, peak]
        return tuple(results)


def traced(make):
    """``make()``'s result, the bytes it holds once made and the peak bytes allocated while making it."""
    gc.collect()
    tracemalloc.start()
    try:
        result = make()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, held, peak


def timed(call, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=3000, help="median reasoning length, in words")
    parser.add_argument("--vocab", type=int, default=151_936, help="the trained tokenizer's vocabulary size")
    parser.add_argument("--batch", type=int, default=8, help="examples per collated batch")
    args = parser.parse_args()

    rows = conversations(args.rows, args.tokens, seed=0)
    started = time.perf_counter()
    tokenizer = trained_tokenizer([row["messages"][1]["content"] for row in rows], args.vocab)
    print(f"tokenizer: {len(tokenizer)} ids, trained in {time.perf_counter() - started:.1f} s")

    layout = file_layout(rows, "rows")
    started = time.perf_counter()
    alone = [piece.example() for row in rows for piece in Encoder(tokenizer).encode(read_conversation(row, layout))[0]]
    alone_s = time.perf_counter() - started
    started = time.perf_counter()
    built, _ = build_sft_examples(rows, tokenizer, max_length=10**9)
    batched_s = time.perf_counter() - started
    assert list(built) == alone
    del alone
    print(f"built {len(built)} examples, {built.tokens:,} tokens, on {len(os.sched_getaffinity(0))} cores")
    print(
        f"tokenized one row at a time in {alone_s:.1f} s ({built.tokens / alone_s:,.0f} tokens/s), in batches in "
        f"{batched_s:.1f} s ({built.tokens / batched_s:,.0f} tokens/s): {alone_s / batched_s:.1f}x"
    )
    kept_s, read_s, size, mapped, copied = kept_and_read(rows, tokenizer, built)
    print(
        f"kept in data.cache_dir in {kept_s:.1f} s ({size / 1e6:.1f} MB, {size / built.tokens:.1f} bytes a token), "
        f"read back in {read_s:.2f} s (rows hashed, entry read and checked): {batched_s / read_s:.1f}x as fast as "
        "tokenizing in batches"
    )
    print(
        f"memory the set read back holds: mapped {mapped / 1e6:.1f} MB, copied into memory {copied / 1e6:.1f} MB "
        "(a machine's ranks share the mapped pages)"
    )
    rows_s, rows_peak, stamp_s, stamp_peak = found_by_stamp(rows, tokenizer)
    print(
        f"found at the next start by its rows in {rows_s:.2f} s (peak {rows_peak / 1e6:.1f} MB: the file read and "
        f"parsed), by the file's stamp in {stamp_s:.2f} s (peak {stamp_peak / 1e6:.1f} MB: not read): "
        f"{rows_s / stamp_s:.1f}x as fast"
    )
    ids = [token for example in built for token in example["input_ids"]]
    print(f"ids >= 257 (an int object each as lists): {sum(token >= 257 for token in ids) / len(ids):.1%}")
    del ids

    listed, list_bytes, _ = traced(lambda: [dict(example) for example in built])
    stored, store_bytes, _ = traced(lambda: Examples(listed))
    assert list(stored) == listed
    tokens = stored.tokens
    rows_out = [
        ("bytes per token", list_bytes / tokens, store_bytes / tokens, "{:.1f}"),
    ]

    rng = random.Random(0)
    batches = [[[rng.randrange(len(stored))] for _ in range(args.batch)] for _ in range(20)]
    for examples in (listed, stored):  # warm-up
        collate(examples, batches[0], 0, packed=False)
    per_batch = [
        timed(lambda examples=examples: [collate(examples, b, 0, packed=False) for b in batches], 3) / len(batches)
        for examples in (listed, stored)
    ]
    rows_out.append(("collate ms per batch", 1e3 * per_batch[0], 1e3 * per_batch[1], "{:.2f}"))

    (old_digest, _, old_peak), (new_digest, _, new_peak) = (
        traced(lambda: content_digest(listed)),
        traced(stored.digest),
    )
    assert old_digest == new_digest
    digest_s = [timed(lambda: content_digest(listed), 1), timed(stored.digest, 1)]
    rows_out.append(("digest s", digest_s[0], digest_s[1], "{:.2f}"))
    rows_out.append(("digest peak MB", old_peak / 1e6, new_peak / 1e6, "{:.1f}"))

    print(f"\n{'':24}{'lists':>12}{'Examples':>12}{'ratio':>10}")
    for name, old, new, fmt in rows_out:
        print(f"{name:24}{fmt.format(old):>12}{fmt.format(new):>12}{old / new:>9.1f}x")
    print(f"\nat 1e9 tokens: lists {list_bytes / tokens:.0f} GB, Examples {store_bytes / tokens:.1f} GB, on every rank")


if __name__ == "__main__":
    main()
