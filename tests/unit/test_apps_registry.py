"""The application registry file, the lateness penalty and ``switchyard apps show``."""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from switchyard.apps import (
    Penalty,
    Registry,
    RegistryError,
    UnknownApplicationError,
    load_registry,
    save_registry,
)

from cli.apps import EXIT_BAD_INPUT, add_arguments, run


def _variant(accuracy: float, classes: int, latency_s: float) -> dict[str, Any]:
    return {
        "latency_s": {"cpu": {"1": latency_s, "32": latency_s * 4}},
        "memory_bytes": 4096,
        "load_s": 0.0015,
        "accuracy": accuracy,
        "recall": [accuracy] * classes,
        "model_file": "models/fast.pkl",
    }


def _valid() -> dict[str, Any]:
    return {
        "applications": [
            {
                "name": "fraud",
                "classes": ["benign", "malignant"],
                "deadline_s": 0.15,
                "penalty": {"kind": "linear", "span_s": 0.1},
                "prior": {"kind": "strong", "concentration": 20},
                "stream_class_mix": [0.95, 0.05],
                "dataset": "fraud-like",
                "feature_dim": 30,
                "variants": {"fast": _variant(0.9, 2, 0.0001), "slow": _variant(0.97, 2, 0.002)},
            },
            {
                "name": "wine",
                "classes": ["a", "b", "c"],
                "deadline_s": 0.0805,
                "penalty": {"kind": "sigmoid", "steepness_per_s": 100, "midpoint_s": 0.05},
                "stream_class_mix": [0.8, 0.1, 0.1],
                "dataset": "wine-dominant",
                "feature_dim": 13,
                "variants": {"mlp-small": _variant(0.95, 3, 0.0002)},
            },
        ]
    }


def _write(tmp_path: Path, data: Any, name: str = "apps.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, _valid()))
    out = tmp_path / "copy" / "registry.json"
    save_registry(registry, out)
    again = load_registry(out)
    assert again == registry
    app = again.application("fraud")
    assert app.variants["slow"].latency_at("cpu", 32) == pytest.approx(0.008)
    assert app.prior.kind == "strong"
    assert app.prior.concentration == 20
    assert app.penalty_function().utility(0.8, lateness_s=0.05) == pytest.approx(0.4)
    assert again.application("wine").prior.kind == "jeffreys"  # the default
    assert app.variants["fast"].model_path(tmp_path) == tmp_path / "models" / "fast.pkl"
    # Batch sizes are JSON object keys, so strings on disk, ints in memory.
    on_disk = json.loads(out.read_text(encoding="utf-8"))
    assert on_disk["applications"][0]["variants"]["fast"]["latency_s"]["cpu"] == {
        "1": 0.0001,
        "32": 0.0004,
    }


def test_registry_models_are_frozen(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, _valid()))
    with pytest.raises(ValueError, match="frozen"):
        registry.applications[0].deadline_s = 1.0  # type: ignore[misc]


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target: Any = data
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


def _duplicate_name(data: dict[str, Any]) -> None:
    data["applications"][1]["name"] = "fraud"


def _remove(path: tuple[str | int, ...]) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target: Any = data
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return change


APP0 = ("applications", 0)
APP1 = ("applications", 1)

BAD_FIELDS = [
    pytest.param(
        _set((*APP1, "variants", "mlp-small", "accuracy"), 1.5),
        "applications[1].variants.mlp-small.accuracy: Input should be less than or equal to 1",
        id="accuracy-above-one",
    ),
    pytest.param(
        _set(("applications",), []),
        "applications: needs at least one application",
        id="no-applications",
    ),
    pytest.param(
        _duplicate_name,
        "applications[1].name: duplicate application name 'fraud' (also applications[0])",
        id="duplicate-name",
    ),
    pytest.param(
        _set((*APP0, "stream_class_mix"), [0.5, 0.3, 0.2]),
        "applications[0].stream_class_mix: has 3 values, expected one per class (2)",
        id="mix-length",
    ),
    pytest.param(
        _set((*APP0, "stream_class_mix"), [0.5, 0.4]),
        "applications[0].stream_class_mix: shares must sum to 1",
        id="mix-sum",
    ),
    pytest.param(
        _set((*APP0, "variants", "slow", "recall"), [0.9, 0.9, 0.9]),
        "applications[0].variants.slow.recall: has 3 values, expected one per class (2)",
        id="recall-length",
    ),
    pytest.param(
        _set((*APP0, "variants", "slow", "recall", 1), -0.1),
        "applications[0].variants.slow.recall[1]: Input should be greater than or equal to 0",
        id="recall-range",
    ),
    pytest.param(
        _set((*APP0, "dataset"), "mnist"),
        "applications[0].dataset: unknown dataset 'mnist'; known: fraud-like, digits, "
        "wine-dominant",
        id="unknown-dataset",
    ),
    pytest.param(
        _set((*APP0, "feature_dim"), 31),
        "applications[0].feature_dim: is 31, dataset 'fraud-like' has 30 features",
        id="feature-dim",
    ),
    pytest.param(
        _set((*APP0, "deadline_s"), 0),
        "applications[0].deadline_s: Input should be greater than 0",
        id="deadline",
    ),
    pytest.param(
        _set((*APP0, "classes"), ["only"]),
        "applications[0].classes: needs at least 2 classes, got 1",
        id="one-class",
    ),
    pytest.param(
        _set((*APP0, "classes"), ["x", "x"]),
        "applications[0].classes[1]: duplicate class name 'x'",
        id="duplicate-class",
    ),
    pytest.param(
        _set((*APP0, "penalty"), {"kind": "linear"}),
        "applications[0].penalty.span_s: a linear penalty needs span_s",
        id="penalty-missing-param",
    ),
    pytest.param(
        _set((*APP0, "penalty"), {"kind": "cliff"}),
        "applications[0].penalty.kind: Input should be 'step', 'linear' or 'sigmoid'",
        id="penalty-kind",
    ),
    pytest.param(
        _set((*APP0, "prior"), {"kind": "jeffreys", "concentration": 0}),
        "applications[0].prior.concentration: Input should be greater than 0",
        id="prior-concentration",
    ),
    pytest.param(
        _set((*APP0, "prior", "kind"), "flat"),
        "applications[0].prior.kind: Input should be 'jeffreys', 'weak' or 'strong'",
        id="prior-kind",
    ),
    pytest.param(
        _set((*APP0, "variants", "fast", "latency_s", "cpu", "1"), -2.0),
        "applications[0].variants.fast.latency_s.cpu.1: Input should be greater than 0",
        id="latency-negative",
    ),
    pytest.param(
        _set((*APP0, "variants", "fast", "latency_s", "cpu"), {"big": 1.0}),
        "applications[0].variants.fast.latency_s.cpu.big (key): Input should be a valid integer",
        id="batch-size-key",
    ),
    pytest.param(
        _set((*APP0, "variants", "fast", "memory_bytes"), 0),
        "applications[0].variants.fast.memory_bytes: Input should be greater than 0",
        id="memory",
    ),
    pytest.param(
        _set((*APP0, "variants", "fast", "model_file"), "/abs/fast.pkl"),
        "applications[0].variants.fast.model_file: must be relative to the registry file",
        id="absolute-model-file",
    ),
    pytest.param(
        _remove((*APP0, "variants", "fast", "load_s")),
        "applications[0].variants.fast.load_s: Field required",
        id="missing-field",
    ),
    pytest.param(
        _set((*APP0, "colour"), "blue"),
        "applications[0].colour: Extra inputs are not permitted",
        id="unknown-field",
    ),
]


@pytest.mark.parametrize(("change", "expected"), BAD_FIELDS)
def test_each_bad_field_is_named_on_one_line(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    data = copy.deepcopy(_valid())
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(RegistryError) as caught:
        load_registry(path)
    message = str(caught.value)
    assert message.startswith(f"registry {path}: {expected}")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", "the file is empty", id="empty"),
        pytest.param("  \n\t", "the file is empty", id="blank"),
        pytest.param(
            '{"applications": [\n  {"name": "x",}\n]}',
            "invalid JSON at line 2 column 16: Expecting property name",
            id="bad-json",
        ),
        pytest.param("[1, 2]", "expected an object with an 'applications' list", id="list"),
        pytest.param("{}", "applications: Field required", id="no-key"),
    ],
)
def test_unreadable_files_are_clear_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "apps.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RegistryError, match=r"^registry .*apps\.json: ") as caught:
        load_registry(path)
    assert expected in str(caught.value)


def test_missing_file_is_a_registry_error(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="cannot read the file: No such file"):
        load_registry(tmp_path / "absent.json")


def test_a_registry_in_milliseconds_is_named_as_the_earlier_format(tmp_path: Path) -> None:
    data = _valid()
    app = data["applications"][0]
    app["deadline_ms"] = app.pop("deadline_s") * 1e3
    variant = app["variants"]["fast"]
    variant["latency_ms"] = variant.pop("latency_s")
    with pytest.raises(RegistryError) as caught:
        load_registry(_write(tmp_path, data))
    message = str(caught.value)
    assert message.startswith(f"registry {tmp_path / 'apps.json'}: deadline_ms, latency_ms: ")
    assert "earlier format, in milliseconds" in message
    assert "rebuild it with `switchyard apps build`" in message


def test_yaml_round_trip(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, _valid()))
    save_registry(registry, tmp_path / "apps.yaml")
    assert load_registry(tmp_path / "apps.yaml") == registry


def test_unknown_application_lists_the_known_ones(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, _valid()))
    with pytest.raises(UnknownApplicationError, match=r"'spam'; known: fraud, wine$"):
        registry.application("spam")


def test_building_a_registry_in_code_validates_too() -> None:
    data = _valid()
    data["applications"][0]["variants"]["fast"]["accuracy"] = -1
    with pytest.raises(ValueError, match="accuracy"):
        Registry.model_validate(data)


# --- penalty -------------------------------------------------------------------------------


def test_step_penalty_keeps_everything_on_time_and_nothing_late() -> None:
    step = Penalty(kind="step")
    assert step.utility(0.9, lateness_s=-0.01) == 0.9
    assert step.utility(0.9, lateness_s=0.0) == 0.9
    assert step.utility(0.9, lateness_s=1e-6) == 0.0


def test_linear_penalty_falls_to_zero_over_its_span() -> None:
    linear = Penalty(kind="linear", span_s=0.1)
    assert linear.utility(0.8, lateness_s=0.0) == 0.8
    assert linear.utility(0.8, lateness_s=0.025) == pytest.approx(0.6)
    assert linear.utility(0.8, lateness_s=0.1) == 0.0
    assert linear.utility(0.8, lateness_s=1e9) == 0.0


def test_sigmoid_penalty_is_one_at_the_deadline_and_half_near_the_midpoint() -> None:
    sigmoid = Penalty(kind="sigmoid", steepness_per_s=100.0, midpoint_s=0.05)
    assert sigmoid.factor(-0.005) == 1.0
    assert sigmoid.factor(0.0) == pytest.approx(1.0)
    raw_at_deadline = 1.0 / (1.0 + math.exp(-5.0))
    assert sigmoid.factor(0.05) == pytest.approx(0.5 / raw_at_deadline)  # 0.503
    assert sigmoid.factor(0.1) == pytest.approx(0.0067, abs=1e-4)
    assert sigmoid.factor(1e9) == 0.0  # no overflow far past the deadline


@pytest.mark.parametrize(
    "penalty",
    [
        Penalty(kind="step"),
        Penalty(kind="linear", span_s=0.04),
        Penalty(kind="sigmoid", steepness_per_s=500.0, midpoint_s=0.0),
        Penalty(kind="sigmoid", steepness_per_s=50.0, midpoint_s=0.2),
    ],
)
def test_every_penalty_is_non_increasing_within_zero_and_one(penalty: Penalty) -> None:
    factors = [penalty.factor(lateness_ms / 1e3) for lateness_ms in range(-50, 500, 5)]
    assert all(0.0 <= f <= 1.0 for f in factors)
    assert all(later <= earlier for earlier, later in itertools.pairwise(factors))
    assert factors[0] == 1.0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"kind": "linear"}, "span_s"),
        ({"kind": "linear", "span_s": 0.0}, "span_s"),
        ({"kind": "linear", "span_s": math.inf}, "span_s"),
        ({"kind": "sigmoid", "midpoint_s": 5.0}, "steepness_per_s"),
        ({"kind": "sigmoid", "steepness_per_s": -1.0, "midpoint_s": 5.0}, "steepness_per_s"),
        ({"kind": "sigmoid", "steepness_per_s": 1.0}, "midpoint_s"),
        ({"kind": "sigmoid", "steepness_per_s": 1.0, "midpoint_s": -1.0}, "midpoint_s"),
        ({"kind": "step", "span_s": 10.0}, "span_s"),
        ({"kind": "cliff"}, "kind"),
    ],
)
def test_bad_penalty_parameters_name_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        Penalty(**params)


def test_utility_checks_its_inputs() -> None:
    step = Penalty(kind="step")
    with pytest.raises(ValueError, match=r"^accuracy: "):
        step.utility(1.2, lateness_s=0.0)
    with pytest.raises(ValueError, match=r"^lateness_s: "):
        step.utility(0.5, lateness_s=math.nan)


# --- switchyard apps show ------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="switchyard apps")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_show_prints_one_row_per_variant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, _valid())
    assert run(_parse(["show", str(path)])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "app",
        "variant",
        "worker",
        "accuracy",
        "b1",
        "ms",
        "b32",
        "ms",
        "memory",
    ]
    assert lines[2].split() == ["fraud", "slow", "cpu", "0.970", "2.000", "8.000", "4.0", "KiB"]
    assert len(lines) == 4


def test_show_of_a_bad_registry_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _valid()
    data["applications"][0]["deadline_s"] = -1
    path = _write(tmp_path, data)
    assert run(_parse(["show", str(path)])) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"switchyard apps show: registry {path}: applications[0].deadline_s: "
        "Input should be greater than 0\n"
    )
