"""``switchyard estimates`` measures how well accuracy estimates track what each
variant really did on a stream following each application's class mix: the mean absolute
error of the profiled accuracy and of SneakPeek's per-request estimate, for k = 1 and 5,
every index kind and every prior (plus a strong prior centred on the stream's mix and a
mismatched one centred on the test split's class frequencies).

A bad input ends the command with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from research.window.command import BadInputError, fail, registry_arguments, resolve_registry

__all__ = ["add_accuracy_arguments", "format_accuracy_table", "run_accuracy"]


_PRIOR_CASES = ("jeffreys", "weak", "strong", "strong-stream", "mismatched")
"""``weak``/``strong``: centred on the training split's class frequencies (the library's
definition); ``strong-stream``: a strong prior centred on the stream's class mix (it
knows the deployment); ``mismatched``: a strong prior centred on the test split's class
frequencies, which the stream does not follow."""


def add_accuracy_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``switchyard estimates`` options."""
    registry_arguments(parser)
    parser.add_argument(
        "--requests", type=int, default=2000, help="stream requests per application"
    )
    parser.add_argument("--seed", type=int, default=0, help="stream seed (default 0)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results")


def run_accuracy(args: argparse.Namespace) -> int:
    """``switchyard estimates``; returns the exit status (2 on bad input)."""
    try:
        return _run_accuracy(args)
    except (ValueError, OSError, KeyError) as exc:
        return fail("estimates", exc)


def _frequencies(labels: NDArray[np.int64], classes: int) -> NDArray[np.float64]:
    counts = np.bincount(labels, minlength=classes).astype(np.float64)
    result: NDArray[np.float64] = counts / counts.sum()
    return result


def _run_accuracy(args: argparse.Namespace) -> int:
    from switchyard.apps.datasets import load_dataset, sample_stream
    from switchyard.apps.variants import load_variant
    from switchyard.estimation import (
        INDEX_KINDS,
        STRONG_CONCENTRATION,
        NeighbourIndex,
        SneakPeekEstimator,
        accuracy_mae,
        dirichlet_alpha,
    )

    if args.requests < 1:
        raise BadInputError(f"--requests: must be >= 1, got {args.requests}")
    if args.seed < 0:
        raise BadInputError(f"--seed: must be >= 0, got {args.seed}")
    registry, registry_dir = resolve_registry(args.registry, args.train_seed)
    results: list[dict[str, Any]] = []
    for position, application in enumerate(registry.applications):
        dataset = load_dataset(application.dataset)
        classes = dataset.num_classes
        rng = np.random.default_rng([args.seed, position])
        mix = application.stream_class_mix
        x, y = sample_stream(dataset, mix, args.requests, rng)
        outcomes: dict[str, NDArray[np.float64]] = {}
        for name, profile in application.variants.items():
            model = load_variant(profile.model_path(registry_dir))
            outcomes[name] = (np.argmax(model.predict_proba(x), axis=1) == y).astype(np.float64)
        profiled = {name: p.accuracy for name, p in application.variants.items()}
        recalls = {name: np.asarray(p.recall) for name, p in application.variants.items()}
        train = _frequencies(dataset.y_train, classes)
        alphas = {
            "jeffreys": dirichlet_alpha("jeffreys", train),
            "weak": dirichlet_alpha("weak", train),
            "strong": dirichlet_alpha("strong", train),
            "strong-stream": dirichlet_alpha("strong", np.asarray(mix) / sum(mix)),
            "mismatched": dirichlet_alpha(
                "strong", _frequencies(dataset.y_test, classes), STRONG_CONCENTRATION
            ),
        }
        for kind in INDEX_KINDS:
            index = NeighbourIndex.build(dataset.x_train, dataset.y_train, kind, seed=0)
            for k in (1, 5):
                labels = index.query_labels(x, k)
                for prior in _PRIOR_CASES:
                    estimator = SneakPeekEstimator(index, alphas[prior], recalls, k=k)
                    estimates = estimator.estimate_from_labels(labels)
                    maes = accuracy_mae(outcomes, profiled, estimates.expected_accuracy)
                    for variant, mae in maes.items():
                        results.append(
                            {
                                "app": application.name,
                                "variant": variant,
                                "index": kind,
                                "k": k,
                                "prior": prior,
                                "profiled_mae": mae.profiled_mae,
                                "sneakpeek_mae": mae.sneakpeek_mae,
                                "observed_accuracy": mae.observed_accuracy,
                                "profiled_accuracy": profiled[variant],
                                "requests": mae.n_requests,
                            }
                        )
    print(format_accuracy_table(results))
    if args.json is not None:
        document = {
            "config": {
                "requests": args.requests,
                "seed": args.seed,
                "registry": str(args.registry) if args.registry else str(registry_dir),
                "priors": {
                    "weak": "centred on the training split's class frequencies, concentration C",
                    "strong": "centred on the training split's class frequencies, "
                    f"concentration {STRONG_CONCENTRATION:g}",
                    "strong-stream": "strong, centred on the stream's class mix",
                    "mismatched": "strong, centred on the test split's class frequencies "
                    "(not the stream's mix)",
                },
            },
            "results": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
        print(f"results written to {args.json}", file=sys.stderr)
    return 0


def format_accuracy_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One line per (application, index, k, prior): MAEs averaged over the variants and
    how many variants SneakPeek estimates better than the profiled accuracy."""
    groups: dict[tuple[str, str, int, str], list[Mapping[str, Any]]] = {}
    for row in results:
        groups.setdefault((row["app"], row["index"], row["k"], row["prior"]), []).append(row)
    header = ["application", "index", "k", "prior", "profiled MAE", "SneakPeek MAE", "wins"]
    body = []
    for (app, kind, k, prior), rows in groups.items():
        wins = sum(1 for r in rows if r["sneakpeek_mae"] < r["profiled_mae"])
        body.append(
            [
                app,
                kind,
                str(k),
                prior,
                f"{statistics.fmean(r['profiled_mae'] for r in rows):.4f}",
                f"{statistics.fmean(r['sneakpeek_mae'] for r in rows):.4f}",
                f"{wins}/{len(rows)}",
            ]
        )
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = []
    for line in [header, *body]:
        cells = [
            cell.ljust(widths[i]) if i < 4 else cell.rjust(widths[i]) for i, cell in enumerate(line)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
