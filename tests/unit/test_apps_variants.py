"""Datasets, model variants and the profiled registry that ``switchyard apps build`` writes.

One module-scoped build (every variant of the three applications, about 6 s on two
cores) serves most tests: it is what a user gets from ``switchyard apps build``.
"""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from switchyard.apps import (
    DATASET_NAMES,
    Registry,
    UnknownDatasetError,
    VariantFileError,
    load_dataset,
    load_registry,
    load_variant,
    sample_stream,
)
from switchyard.apps.datasets import DATASET_SPECS
from switchyard.apps.profiling import evaluate
from switchyard.apps.registry_file import REGISTRY_FILE
from switchyard.apps.variants import LogRegPcaVariant, train_variant

from cli.apps import EXIT_BAD_INPUT, add_arguments, run


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="switchyard apps")
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Registry]:
    """``switchyard apps build --out DIR --repeats 5``: the folder and its registry."""
    out = tmp_path_factory.mktemp("apps")
    assert run(_parse(["build", "--out", str(out), "--seed", "0", "--repeats", "5"])) == 0
    return out, load_registry(out / REGISTRY_FILE)


def test_importing_the_package_loads_neither_torch_nor_sklearn() -> None:
    code = (
        "import sys\n"
        "import switchyard.apps, switchyard.apps.variants, switchyard.apps.profiling\n"
        "import cli.apps, switchyard.apps.datasets\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sklearn'))\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


# --- datasets --------------------------------------------------------------------------


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_datasets_are_split_standardised_and_match_their_spec(name: str) -> None:
    dataset = load_dataset(name)
    spec = DATASET_SPECS[name]
    assert dataset.feature_dim == spec.feature_dim
    assert dataset.class_names == spec.class_names
    assert dataset.x_train.dtype == np.float32
    assert dataset.y_test.dtype == np.int64
    total = len(dataset.y_train) + len(dataset.y_test)
    assert len(dataset.y_test) == pytest.approx(0.3 * total, abs=1)
    assert set(np.unique(dataset.y_test)) == set(range(dataset.num_classes))
    assert np.allclose(dataset.x_train.mean(axis=0), 0.0, atol=1e-4)
    assert not dataset.x_test.flags.writeable


def test_fraud_like_has_the_majority_class_first() -> None:
    dataset = load_dataset("fraud-like")
    assert dataset.class_names[0] == "benign"
    assert np.mean(dataset.y_train == 0) > 0.6
    assert dataset.default_stream_mix == (0.95, 0.05)


def test_unknown_dataset_lists_the_known_ones() -> None:
    with pytest.raises(UnknownDatasetError, match="'mnist'; known: fraud-like, digits"):
        load_dataset("mnist")


@pytest.mark.parametrize(
    ("name", "mix"),
    [("wine-dominant", (0.8, 0.1, 0.1)), ("fraud-like", (0.95, 0.05)), ("digits", (0.1,) * 10)],
)
def test_sample_stream_follows_the_mix_with_real_test_rows(
    name: str, mix: tuple[float, ...]
) -> None:
    dataset = load_dataset(name)
    features, labels = sample_stream(dataset, mix, 20_000, np.random.default_rng(7))
    assert features.shape == (20_000, dataset.feature_dim)
    shares = np.bincount(labels, minlength=dataset.num_classes) / labels.size
    assert shares == pytest.approx(mix, abs=0.012)
    # Every drawn row is a test row of the drawn class.
    label_of_row = {
        row.tobytes(): int(y) for row, y in zip(dataset.x_test, dataset.y_test, strict=True)
    }
    assert all(
        label_of_row[row.tobytes()] == y
        for row, y in zip(features[:500], labels[:500], strict=True)
    )


def test_sample_stream_is_reproducible_for_a_seed() -> None:
    dataset = load_dataset("wine-dominant")
    first = sample_stream(dataset, (0.8, 0.1, 0.1), 50, np.random.default_rng(3))
    second = sample_stream(dataset, (0.8, 0.1, 0.1), 50, np.random.default_rng(3))
    assert np.array_equal(first[0], second[0])
    assert np.array_equal(first[1], second[1])


@pytest.mark.parametrize(
    ("mix", "message"),
    [
        ((0.5, 0.5), "has 2 values, expected one per class"),
        ((0.8, 0.1, 0.2), "must sum to 1"),
        ((1.2, -0.1, -0.1), ">= 0"),
    ],
)
def test_sample_stream_rejects_a_bad_mix(mix: tuple[float, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_stream(load_dataset("wine-dominant"), mix, 10, np.random.default_rng(0))


# --- variants --------------------------------------------------------------------------


def test_the_large_mlp_is_more_accurate_and_logreg_faster_on_digits(
    built: tuple[Path, Registry],
) -> None:
    variants = built[1].application("digits").variants
    large, logreg = variants["mlp-large"], variants["logreg-pca4"]
    assert large.accuracy > logreg.accuracy + 0.08
    assert logreg.latency_at("cpu", 32) < large.latency_at("cpu", 32)
    assert logreg.memory_bytes < large.memory_bytes


def test_build_profiles_every_variant_of_every_application(
    built: tuple[Path, Registry],
) -> None:
    out, registry = built
    assert registry.names() == DATASET_NAMES
    for app in registry.applications:
        assert tuple(app.variants) == DATASET_SPECS[app.dataset].variants
        assert app.deadline_s == 0.15
        assert app.penalty.kind == "sigmoid"
        assert app.prior.kind == "jeffreys"
        assert app.stream_class_mix == DATASET_SPECS[app.dataset].default_stream_mix
        for profile in app.variants.values():
            assert sorted(profile.latency_s["cpu"]) == [1, 2, 4, 8, 16, 32]
            assert profile.model_path(out).is_file()
            assert len(profile.recall) == len(app.classes)
            assert profile.accuracy > 0.7


def test_every_application_has_a_clearly_weaker_light_variant(
    built: tuple[Path, Registry],
) -> None:
    # What the scheduler exploits: each application's light variant (a logistic
    # regression on a few components, a few KiB) is clearly less accurate than its best
    # network. Their speeds are measured in benchmarks, not asserted here.
    _, registry = built
    for app in registry.applications:
        (light,) = (p for name, p in app.variants.items() if name.startswith("logreg-"))
        best = max(app.variants.values(), key=lambda p: p.accuracy)
        assert best.accuracy - light.accuracy >= 0.025, app.name
        assert light.memory_bytes * 50 < max(p.memory_bytes for p in app.variants.values())


@pytest.mark.parametrize(
    ("app_name", "variant_name"),
    [(app, variant) for app, spec in DATASET_SPECS.items() for variant in spec.variants],
)
def test_a_loaded_variant_predicts_exactly_as_profiled(
    built: tuple[Path, Registry], app_name: str, variant_name: str
) -> None:
    out, registry = built
    app = registry.application(app_name)
    profile = app.variants[variant_name]
    variant = load_variant(profile.model_path(out))
    dataset = load_dataset(app_name)
    accuracy, recall = evaluate(variant, dataset)
    assert accuracy == profile.accuracy
    assert recall == profile.recall
    again = load_variant(profile.model_path(out))
    assert np.array_equal(
        variant.predict_proba(dataset.x_test), again.predict_proba(dataset.x_test)
    )


def test_training_is_deterministic_for_a_seed() -> None:
    dataset = load_dataset("wine-dominant")
    first = train_variant("mlp-small", dataset, seed=5).predict_proba(dataset.x_test)
    second = train_variant("mlp-small", dataset, seed=5).predict_proba(dataset.x_test)
    other = train_variant("mlp-small", dataset, seed=6).predict_proba(dataset.x_test)
    assert np.array_equal(first, second)
    assert not np.array_equal(first, other)


def test_a_saved_variant_gives_identical_predictions(tmp_path: Path) -> None:
    dataset = load_dataset("wine-dominant")
    for name in ("logreg-pca4", "mlp-small"):
        variant = train_variant(name, dataset, seed=1)
        path = tmp_path / f"{name}{variant.file_suffix}"
        variant.save(path)
        loaded = load_variant(path)
        assert loaded.name == name
        assert np.array_equal(
            loaded.predict_proba(dataset.x_test), variant.predict_proba(dataset.x_test)
        )


@pytest.mark.parametrize("name", ["fraud-like", "wine-dominant"])
def test_logreg_fast_path_matches_sklearn(name: str) -> None:
    dataset = load_dataset(name)
    variant = train_variant("logreg-pca4", dataset, seed=0)
    assert isinstance(variant, LogRegPcaVariant)
    ours = variant.predict_proba(dataset.x_test)
    theirs = variant.model.predict_proba(np.asarray(dataset.x_test, dtype=np.float64))
    assert ours == pytest.approx(theirs, abs=1e-9)
    assert ours.sum(axis=1) == pytest.approx(np.ones(len(ours)))


def test_predict_proba_rejects_the_wrong_width() -> None:
    variant = train_variant("logreg-pca4", load_dataset("wine-dominant"), seed=0)
    with pytest.raises(ValueError, match=r"x: expected shape \[n, 13\]"):
        variant.predict_proba(np.zeros((2, 12), dtype=np.float32))


def test_loading_a_bad_model_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VariantFileError, match="unknown model file kind"):
        load_variant(tmp_path / "model.onnx")
    with pytest.raises(VariantFileError, match="cannot load the variant"):
        load_variant(tmp_path / "absent.pkl")
    foreign = tmp_path / "foreign.pkl"
    foreign.write_bytes(pickle.dumps({"weights": [1, 2]}))
    with pytest.raises(VariantFileError, match="not a switchyard scikit-learn variant"):
        load_variant(foreign)
    header = tmp_path / "net.json"
    header.write_text('{"format": "something-else"}', encoding="utf-8")
    with pytest.raises(VariantFileError, match="not a switchyard torch variant"):
        load_variant(header)


def test_build_into_a_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "taken"
    target.write_text("x", encoding="utf-8")
    assert run(_parse(["build", "--out", str(target)])) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (
        f"switchyard apps build: --out: {target} exists and is not a folder\n"
    )


def test_build_if_missing_leaves_an_existing_registry_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "registry.json"
    registry.write_text('{"kept": true}', encoding="utf-8")
    assert run(_parse(["build", "--out", str(tmp_path), "--if-missing"])) == 0
    assert registry.read_text(encoding="utf-8") == '{"kept": true}'
    assert "exists already" in capsys.readouterr().out
