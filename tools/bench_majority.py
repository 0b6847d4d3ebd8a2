"""What maj@j below n costs: klear's exact estimator against the bootstrap it replaces, on the same votes.

``klear.eval`` reports maj@j for j below the n samples it drew (`klear.eval.estimators.majority_at`): maj@n's
expectation over every draw of j of the n samples, computed from the problem's answer counts. The usual way is a
bootstrap: draw ``--draws`` random subsets of j samples and average their majorities. The bench makes ``--problems``
problems of ``--n`` votes as a model gives them (a per-problem accuracy drawn uniformly, the right answer with that
probability, else one of ``--wrong`` wrong answers by a Zipf law, or no answer at 5%), then for each reported j
between 2 and n times both over every problem and gives the bootstrap's error against the exact value (mean over
problems, and of the set's maj@j). Two last lines time the exact estimator on one problem of ``--large`` samples,
2% of them right, the others spread over 100 wrong answers, then over as many as there are samples (most of them
given once or twice: a weak model's samples, the heaviest case). `klear.eval.estimators.MAJORITY_SAMPLES` bounds
the samples it is asked to take.

    python tools/bench_majority.py [--problems 500] [--n 64] [--draws 1000] [--large 1024]
"""

from __future__ import annotations

import argparse
import random
import time

from klear.eval.estimators import majority, majority_at, majority_ks


def votes_of(rng: random.Random, n: int, wrong: int) -> tuple[list[str | None], list[bool]]:
    """One problem's ``n`` votes and verdicts, as described in the module's docstring."""
    accuracy, weights = rng.random(), [1 / (rank + 1) for rank in range(wrong)]
    votes: list[str | None] = []
    for _ in range(n):
        draw = rng.random()
        if draw < 0.05:
            votes.append(None)
        elif draw < 0.05 + 0.95 * accuracy:
            votes.append("right")
        else:
            votes.append(f"wrong {rng.choices(range(wrong), weights)[0]}")
    return votes, [vote == "right" for vote in votes]


def bootstrap(votes: list[str | None], correct: list[bool], j: int, draws: int, rng: random.Random) -> float:
    """maj@j as the mean majority of ``draws`` random draws of ``j`` samples (an answer right as the estimator
    counts it: when any sample giving it is)."""
    right = {vote for vote, flag in zip(votes, correct, strict=True) if flag and vote is not None}
    total = 0.0
    for _ in range(draws):
        drawn = rng.sample(votes, j)
        total += majority(drawn, [vote in right for vote in drawn])
    return total / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=500)
    parser.add_argument("--n", type=int, default=64, help="samples per problem")
    parser.add_argument("--wrong", type=int, default=20, help="distinct wrong answers a problem's samples draw from")
    parser.add_argument("--draws", type=int, default=1000, help="the bootstrap's draws per problem and j")
    parser.add_argument("--large", type=int, default=1024, help="samples of the one heavy problem timed last")
    args = parser.parse_args()

    rng = random.Random(0)
    problems = [votes_of(rng, args.n, args.wrong) for _ in range(args.problems)]
    exact_s = bootstrap_s = 0.0
    for j in majority_ks(args.n // 2, args.n):
        start = time.perf_counter()
        exact = [majority_at(votes, correct, j) for votes, correct in problems]
        exact_s += (middle := time.perf_counter()) - start
        drawn = [bootstrap(*problem, j, args.draws, random.Random(i)) for i, problem in enumerate(problems)]
        bootstrap_s += time.perf_counter() - middle
        error = sum(abs(a - b) for a, b in zip(exact, drawn, strict=True)) / len(exact)
        set_error = abs(sum(exact) - sum(drawn)) / len(exact)
        print(
            f"maj@{j}: exact {sum(exact) / len(exact):.4f}; {args.draws}-draw bootstrap off by {error:.4f} a problem"
            f" (mean), {set_error:.4f} on the set"
        )
    large_rng = random.Random(1)
    for answers in (100, args.large):  # a model that mostly agrees, and one whose samples mostly differ
        # the right answer in 2% of the samples, the others spread over ``answers`` wrong ones
        votes = [
            "right" if large_rng.random() < 0.02 else f"wrong {large_rng.randrange(answers)}" for _ in range(args.large)
        ]
        correct = [vote == "right" for vote in votes]
        start = time.perf_counter()
        majority_at(votes, correct, args.large // 2)
        print(
            f"one problem of {args.large} samples over {answers} answers: maj@{args.large // 2} exact in "
            f"{time.perf_counter() - start:.2f} s"
        )
    print(
        f"bench_majority: {args.problems} problems x {args.n} samples, maj@j for j in "
        f"{majority_ks(args.n // 2, args.n)}: exact {exact_s:.2f} s, {args.draws}-draw bootstrap {bootstrap_s:.2f} s;"
        f" bootstrap / exact time: {bootstrap_s / exact_s:.2f}x"
    )


if __name__ == "__main__":
    main()
