"""How long loading an RL set takes when each prompt is measured alone vs in batches (`PromptTokens.many`).

A run measures every prompt of its training and evaluation sets in tokens before the first step, so that a prompt
over ``data.max_prompt_tokens`` is refused or cut by file and line. The bench writes ``--problems`` math rows whose
prompts run 30-200 words drawn from a Zipf law, tokenized by a byte-level BPE tokenizer of a real vocabulary size
trained in the run (`bench_sft_data.trained_tokenizer`; nothing is downloaded), and loads them with
`klear.data.problems.load_problems` twice in the same run: with a callable that tokenizes one prompt per call (how
klear measured them before) and with `klear.data.prompts.PromptTokens`, which renders a batch of prompts and
tokenizes it in one call. Both must keep the same problems with the same lengths. Then it measures the memory a
loaded set holds with its rows kept (`Problem.row`, for the commands that copy them) and dropped, as a run drops
them.

Then a run's load as ``klear.fit`` does it, the rows in verl's layout as DAPO's training file carries them: the
preflight reads and checks every row without a tokenizer and keeps the checked set (`klear.data.preflight`), the
stage measures its prompts; against the stage reading and checking the file again. It times the same load on a file
of as many rows that repeat each of 1/100 of the prompts 100 times, as DAPO-Math-17k's training file does (each
distinct prompt is measured once), and counting the tokens of the rendered prompts by the tokenizer's Rust backend
(`klear.data.prompts.token_counts`) against taking the lengths of the ids the tokenizer returns (`token_ids`).
Each way must give the same problems. Last, the peak memory of the preflight's check of a file read whole against
read a part at a time, as it reads a JSON-lines file (`klear.data.row_parts.RowParts`).

    python tools/bench_load_problems.py [--problems 20000] [--vocab 151936]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench_sft_data import conversations, trained_tokenizer

from klear.data.problems import Task, load_problems
from klear.data.prompts import PromptTokens, char_bound, encode_prompt
from klear.data.readers import write_jsonl
from klear.rewards.routing import routed_reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=20_000)
    parser.add_argument("--vocab", type=int, default=151_936, help="the trained tokenizer's vocabulary size")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    args = parser.parse_args()

    texts = [row["messages"][1]["content"] for row in conversations(300, 300, seed=0)]
    tokenizer = trained_tokenizer(texts, args.vocab)
    words, rng = " ".join(texts).split(), random.Random(0)
    rows = [
        {"problem": " ".join(rng.choices(words, k=rng.randint(30, 200))), "answer": str(index)}
        for index in range(args.problems)
    ]
    with tempfile.TemporaryDirectory() as folder:
        path = str(write_jsonl(rows, Path(folder) / "problems.jsonl"))

        def load(prompt_length):
            started = time.perf_counter()
            loaded = load_problems(
                path,
                Task("math"),
                routed_reward("math"),
                prompt_length=prompt_length,
                char_bound=char_bound(tokenizer),
                max_prompt_tokens=args.max_prompt_tokens,
            )
            return loaded, time.perf_counter() - started

        alone, alone_s = load(lambda prompt: len(encode_prompt(tokenizer, prompt)))
        batched, batched_s = load(PromptTokens(tokenizer))
    assert [(p.line, p.prompt) for p in alone.problems] == [(p.line, p.prompt) for p in batched.problems]
    assert alone.longest_prompt == batched.longest_prompt and alone.bad == batched.bad
    print(
        f"{len(batched.problems)} problems (longest prompt {batched.longest_prompt} tokens), "
        f"{len(os.sched_getaffinity(0))} cores"
    )
    print(
        f"loaded measuring each prompt alone in {alone_s:.2f} s, in batches in {batched_s:.2f} s: "
        f"{alone_s / batched_s:.1f}x"
    )
    held_memory(rows)
    run_load(rows, tokenizer, args.max_prompt_tokens)
    check_memory(rows)


def verl_rows(rows: list[dict]) -> list[dict]:
    """``rows`` in verl's layout, as DAPO's training file carries them."""
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": row["problem"]}],
            "ability": "MATH",
            "reward_model": {"ground_truth": row["answer"], "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(index), "split": "train"},
        }
        for index, row in enumerate(rows)
    ]


def run_load(rows: list[dict], tokenizer, max_prompt_tokens: int) -> None:
    """A run's load (the preflight's checked set measured by the stage) against the stage reading the file again;
    on distinct and on repeated prompts; and the token counts by the backend against the ids' lengths."""
    from klear.data.preflight import check_problems, kept_problems
    from klear.data.prompts import AS_GIVEN, render_prompt, token_counts, token_ids

    repeats = 100
    repeated = [rows[index % max(1, len(rows) // repeats)] for index in range(len(rows))]
    with tempfile.TemporaryDirectory() as folder:
        loaded = {}
        for name, chosen in (("distinct", rows), ("repeated", repeated)):
            path = str(write_jsonl(verl_rows(chosen), Path(folder) / f"{name}.jsonl"))
            task, reward = Task("math"), routed_reward("math")

            def stage(checked, path=path, task=task, reward=reward):
                return load_problems(path, task, reward, prompt_length=PromptTokens(tokenizer), keep_rows=False,
                                     char_bound=char_bound(tokenizer), max_prompt_tokens=max_prompt_tokens,
                                     checked=checked)  # fmt: skip

            started = time.perf_counter()
            check_problems(path, task, reward, "train", AS_GIVEN)  # klear.compare's check: nothing kept
            again = stage(None)
            again_s = time.perf_counter() - started
            started = time.perf_counter()
            check_problems(path, task, reward, "train", AS_GIVEN, keep=True)  # klear.fit's
            once = stage(kept_problems(path, "train", task, reward, AS_GIVEN))
            loaded[name] = once_s = time.perf_counter() - started
            assert once.report() == again.report() and once.longest_prompt == again.longest_prompt
            print(
                f"a run's load of {len(chosen)} rows ({once.distinct} distinct): checked once "
                f"{once_s:.2f} s, checked again by the stage {again_s:.2f} s: {again_s / once_s:.1f}x"
            )
    print(
        f"{len(rows)} rows repeating each prompt {repeats} times load in {loaded['repeated']:.2f} s, "
        f"{len(rows)} distinct in {loaded['distinct']:.2f} s: {loaded['distinct'] / loaded['repeated']:.1f}x"
    )
    texts = [(render_prompt(tokenizer, row["problem"]), False) for row in rows]
    lengths = [len(ids) for ids in token_ids(tokenizer, texts)]  # the tokenizer's caches warmed for both
    times: dict[str, list[float]] = {"ids": [], "counts": []}
    for _ in range(2):
        started = time.perf_counter()
        assert [len(ids) for ids in token_ids(tokenizer, texts)] == lengths
        times["ids"].append(time.perf_counter() - started)
        started = time.perf_counter()
        assert token_counts(tokenizer, texts) == lengths
        times["counts"].append(time.perf_counter() - started)
    ids_s, counts_s = min(times["ids"]), min(times["counts"])
    print(
        f"tokens of {len(texts)} rendered prompts counted by the backend in {counts_s:.2f} s, as the lengths of "
        f"their ids in {ids_s:.2f} s: {ids_s / counts_s:.1f}x"
    )


def check_memory(rows: list[dict]) -> None:
    """The peak memory of the preflight's check of a file (no tokenizer, rows dropped), its rows read whole against
    a part at a time (`klear.data.row_parts.RowParts`), parts of a tenth of the file here."""
    from klear.data.row_parts import RowParts

    size = max(1, len(rows) // 10)
    with tempfile.TemporaryDirectory() as folder:
        path = str(write_jsonl(verl_rows(rows), Path(folder) / "verl.jsonl"))
        peak = {parts: traced_load(path, len(rows), size if parts else 0)[1] for parts in (False, True)}
    print(
        f"peak of a check of {len(rows)} rows in verl's layout: {peak[True]:.0f} MB read in parts of {size} rows "
        f"(a run's: {RowParts.SIZE}), {peak[False]:.0f} MB read whole: {peak[False] / peak[True]:.1f}x"
    )


def held_memory(rows: list[dict]) -> None:
    """The memory a loaded set holds, its rows kept (what curate and filter-tests copy) and dropped (a run's,
    `klear.data.stage_problems`), the rows written in verl's layout as DAPO's training file carries them."""
    with tempfile.TemporaryDirectory() as folder:
        path = str(write_jsonl(verl_rows(rows), Path(folder) / "verl.jsonl"))
        held = {keep_rows: traced_load(path, len(rows), keep_rows=keep_rows)[0] for keep_rows in (True, False)}
    print(
        f"held after loading ({len(rows)} rows in verl's layout): {held[True]:.0f} MB with the rows, "
        f"{held[False]:.0f} MB without (a run's): {held[True] / held[False]:.1f}x"
    )


def traced_load(path: str, problems: int, parts: int = 0, keep_rows: bool = False) -> tuple[float, float]:
    """The memory (MB of traced allocations) that loading ``path``'s ``problems`` problems holds after and at its
    peak; read ``parts`` lines at a time when > 0 (`klear.data.row_parts.RowParts`), else whole."""
    from klear.data.row_parts import RowParts

    gc.collect()
    tracemalloc.start()
    rows = RowParts(path, parts) if parts else None
    loaded = load_problems(path, Task("math", route=True), routed_reward("math"), keep_rows=keep_rows, rows=rows)
    gc.collect()
    held, peak = (size / 2**20 for size in tracemalloc.get_traced_memory())
    tracemalloc.stop()
    assert len(loaded.problems) == problems
    return held, peak


if __name__ == "__main__":
    main()
