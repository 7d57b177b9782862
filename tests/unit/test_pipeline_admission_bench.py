"""The pipeline admission bench's arithmetic: the capacity it offers multiples of, and
one Poisson plan for both modes."""

from __future__ import annotations

import pytest
from switchyard.config import Settings
from switchyard.serving.artifacts import settings_catalogue

from bench.pipeline_admission import capacity_per_model_s, poisson_plan, stack_settings


def test_capacity_is_one_replica_of_the_slowest_stage_per_worker() -> None:
    settings = stack_settings(Settings(), admission="off", time_scale=1.0)
    catalogue = settings_catalogue(settings)
    # txt2img-hd's slowest stage is the upscaler's 3 model seconds.
    assert capacity_per_model_s(catalogue, "txt2img-hd", 2) == pytest.approx(2 / 3.0)
    assert capacity_per_model_s(catalogue, "txt2img-hd", 4) == pytest.approx(4 / 3.0)


def test_a_plan_is_the_same_for_a_seed_and_offers_its_rate() -> None:
    plan = poisson_plan("txt2img-hd", 2.0, 500.0, seed=3)
    again = poisson_plan("txt2img-hd", 2.0, 500.0, seed=3)
    assert [p.arrival_s for p in plan] == [p.arrival_s for p in again]
    assert [p.arrival_s for p in plan] != [
        p.arrival_s for p in poisson_plan("txt2img-hd", 2.0, 500.0, seed=4)
    ]
    assert 900 <= len(plan) <= 1100  # 1,000 expected
    assert all(p.kind == "pipeline" and p.app == "txt2img-hd" for p in plan)
    assert all(0.0 <= p.arrival_s < 500.0 for p in plan)
