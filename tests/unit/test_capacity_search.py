"""The capacity search (research.llm.capacity) on synthetic attainment curves: it finds
the load where attainment crosses each target, to its tolerance, with few probes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from research.llm.capacity import CapacityPoint, search_capacity


def curve(
    attainment: Callable[[float], float], calls: list[float]
) -> Callable[[float], CapacityPoint]:
    def evaluate(scale: float) -> CapacityPoint:
        calls.append(scale)
        met = attainment(scale)
        return CapacityPoint(
            load_scale=scale,
            offered_rps=10.0 * scale,
            slo_attainment=met,
            goodput_rps=10.0 * scale * met,
            ttft_p99_s=0.1,
            tpot_p99_s=0.01,
            p99_s=1.0,
        )

    return evaluate


def falling(knee: float) -> Callable[[float], float]:
    """All met up to ``knee``, then falling linearly to none at twice the knee."""
    return lambda scale: 1.0 if scale <= knee else max(0.0, 2.0 - scale / knee)


def test_each_target_is_found_within_the_tolerance_of_where_the_curve_crosses_it() -> None:
    calls: list[float] = []
    result = search_capacity(curve(falling(7.3), calls), targets=(0.90, 0.99), tolerance=0.02)
    # attainment = 2 - s / 7.3 crosses 0.90 at 8.03 and 0.99 at 7.373.
    for found, crossing in zip(result.targets, (7.3 * 1.10, 7.3 * 1.01), strict=True):
        assert found.held is not None
        assert found.failed is not None
        assert found.held.load_scale <= crossing < found.failed.load_scale
        assert found.failed.load_scale <= found.held.load_scale * 1.02
    assert len(calls) == len(set(calls)) <= 20  # each load simulated once
    assert [p.load_scale for p in result.probes] == sorted(calls)


def test_the_most_goodput_is_the_best_probe() -> None:
    result = search_capacity(curve(falling(4.0), []), targets=(0.9,))
    assert result.max_goodput.goodput_rps == max(p.goodput_rps for p in result.probes)
    # goodput 10 s (2 - s/4) peaks at s = 4 (40/s); the search probes near it.
    assert result.max_goodput.goodput_rps == pytest.approx(40.0, rel=0.05)


def test_a_strict_target_missed_at_the_first_load_is_searched_below_it() -> None:
    # 0.9 holds at the start (load 1) but 0.99 only below 0.5.
    attainment = lambda scale: 1.0 if scale <= 0.5 else 0.95  # noqa: E731
    result = search_capacity(curve(attainment, []), targets=(0.9, 0.99), max_scale=4.0)
    lenient, strict = result.targets
    assert lenient.held is not None
    assert lenient.failed is None
    assert strict.held is not None
    assert strict.failed is not None
    assert strict.held.load_scale <= 0.5 < strict.failed.load_scale


def test_a_target_never_met_has_no_capacity() -> None:
    result = search_capacity(curve(lambda _: 0.5, []), targets=(0.9,), min_scale=0.25)
    (found,) = result.targets
    assert found.held is None
    assert found.failed is not None
    assert found.failed.load_scale == 0.25


def test_a_curve_that_recovers_reports_its_first_edge() -> None:
    # Misses 0.9 between 3 and 5 only: the conservative answer is the edge at 3.
    attainment = lambda scale: 0.5 if 3.0 < scale <= 5.0 else 1.0  # noqa: E731
    result = search_capacity(curve(attainment, []), targets=(0.9,), start_scale=4.0)
    (found,) = result.targets
    assert found.held is not None
    assert found.failed is not None
    assert found.held.load_scale <= 3.0 < found.failed.load_scale


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"targets": ()}, "at least one"),
        ({"targets": (1.5,)}, "within (0, 1]"),
        ({"start_scale": 0.0}, "min_scale"),
        ({"tolerance": 0.0}, "tolerance"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("]", r"\]")):
        search_capacity(curve(falling(2.0), []), **kwargs)  # type: ignore[arg-type]
