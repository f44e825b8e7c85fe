"""How much of a request's expert load its prompt can tell: kernel neighbours over several splits,
and the same kernel told each request's decode length (an oracle no prompt-level predictor has).

Usage:
    .venv/bin/python benchmarks/prompt_ceiling.py [--splits 5] [--test-fraction 0.3]

On ../shared/data/routing/gptoss20b_decode.npz, for each seeded split by request: the frequency
prior, `KernelNeighbours` as shipped (settings by leave-one-out on the training requests), the
kernel's mean alone (no median blend, its settings tuned the same way), and the kernel whose
similarity also penalises the difference in log decode length, |log n_i - log n_j| x beta, with
the test request's actual length (beta and the kernel's settings chosen by leave-one-out on the
training requests). The last column is a ceiling check, not a predictor: it shows what knowing the
length adds. The R^2 of the length predicted from the prompt (kernel regression on the same
neighbours) shows whether a predictor could learn it. All rows are static (test requests do not
join the index as they finish), so they sit a little below `eval-routing`'s online figures.
Takes about a minute. Writes benchmarks/results/prompt_ceiling.md.
"""

from __future__ import annotations

import argparse

import numpy as np
from common import GPTOSS_ROUTING, load_gptoss_routing, md_header, md_row, write_result

from moeless.prediction.predictors import Embedder, FrequencyPrior
from moeless.prediction.prompt_predictors import (
    BANDWIDTHS,
    NEIGHBOURS,
    SHRINKS,
    KernelNeighbours,
    kernel_regression,
    load_accuracy,
    shares_by_request,
)
from moeless.prediction.routing_eval import split_by_request

BETAS = (0.05, 0.1, 0.2, 0.4)


def _length_oracle(
    train_vectors: np.ndarray,
    test_vectors: np.ndarray,
    train_shares: np.ndarray,
    log_lengths: tuple[np.ndarray, np.ndarray],
    prior: np.ndarray,
) -> np.ndarray:
    """Kernel over cosine - beta |log length difference|, settings by leave-one-out: [q, L, E]."""
    train_length, test_length = log_lengths
    cosine = train_vectors @ train_vectors.T
    np.fill_diagonal(cosine, -np.inf)
    best = (-1.0, 0.0, 0, 0.0, 0.0)
    for beta in BETAS:
        similarity = cosine - beta * np.abs(train_length[:, None] - train_length[None])
        for neighbours in NEIGHBOURS:
            for bandwidth in BANDWIDTHS:
                kernel = kernel_regression(similarity, train_shares, neighbours, bandwidth)
                for shrink in SHRINKS:
                    score = load_accuracy((1 - shrink) * kernel + shrink * prior, train_shares).mean()
                    if score > best[0]:
                        best = (score, beta, neighbours, bandwidth, shrink)
    _, beta, neighbours, bandwidth, shrink = best
    similarity = test_vectors @ train_vectors.T - beta * np.abs(test_length[:, None] - train_length[None])
    return (1 - shrink) * kernel_regression(similarity, train_shares, neighbours, bandwidth) + shrink * prior


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--test-fraction", type=float, default=0.3)
    args = parser.parse_args()
    trace = load_gptoss_routing()
    requests = np.array(sorted(p["request"] for p in trace.prompts))
    prompts = {p["request"]: p["prompt"] for p in trace.prompts}
    vectors = dict(zip(requests.tolist(), Embedder()([prompts[int(r)] for r in requests]), strict=True))
    log_length = {int(r): float(np.log(max((trace.request == r).sum(), 1))) for r in requests}
    lines = [
        f"{GPTOSS_ROUTING.name}: {len(requests)} requests, {args.splits} splits, test fraction "
        f"{args.test_fraction}; load accuracy on the test requests, static index.",
        "",
        *md_header(("seed", "prior", "kernel", "mean only", "+ length oracle", "length R^2")),
    ]
    print("\n".join(lines))
    rows = []
    for seed in range(args.splits):
        train, test = split_by_request(trace, seed, args.test_fraction)
        prior_model = FrequencyPrior().fit(trace, train)
        prior = np.stack([prior_model.shares(i) for i in sorted(prior_model.counts)])
        train_shares, test_shares = shares_by_request(trace, train), shares_by_request(trace, test)
        train_raw = np.stack([vectors[int(r)] for r in train])
        test_raw = np.stack([vectors[int(r)] for r in test])
        shipped = KernelNeighbours(None, prior_model).fit([""] * len(train), train_shares, train_raw)
        predicted = np.stack([shipped.predict_array(v) for v in test_raw])
        mean_only = KernelNeighbours(None, prior_model).fit(
            [""] * len(train), train_shares, train_raw, medians=(0.0,)
        )
        means = np.stack([mean_only.predict_array(v) for v in test_raw])
        train_vectors, test_vectors = shipped.vectors, shipped.centred(test_raw)
        lengths = (
            np.array([log_length[int(r)] for r in train]),
            np.array([log_length[int(r)] for r in test]),
        )
        oracle = _length_oracle(train_vectors, test_vectors, train_shares, lengths, prior)
        similarity = test_vectors @ train_vectors.T
        guessed = kernel_regression(similarity, lengths[0][:, None, None], 16, 0.1)[:, 0, 0]
        r2 = 1 - ((guessed - lengths[1]) ** 2).mean() / lengths[1].var()
        scores = [load_accuracy(p, test_shares).mean() for p in (prior[None], predicted, means, oracle)]
        rows.append(scores)
        lines.append(md_row((seed, *(f"{score:.3f}" for score in scores), f"{r2:.3f}")))
        print(lines[-1], flush=True)
    table = np.array(rows)
    gains = table[:, 1:] - table[:, :1]
    lines += [
        "",
        f"Mean gain over the prior: kernel {gains[:, 0].mean():+.3f} (min {gains[:, 0].min():+.3f}), "
        f"mean only {gains[:, 1].mean():+.3f}, with the length oracle {gains[:, 2].mean():+.3f}.",
    ]
    print(lines[-1])
    write_result("prompt_ceiling", "how much of a request's expert load its prompt can tell", lines)


if __name__ == "__main__":
    main()
