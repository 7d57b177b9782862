"""Classification calls to the ingress (``/v1/apps/{app}/infer``), over the in-memory bus
with the fake worker of :mod:`tests.service.ingress_support`: the label and its
probabilities, the deadline, priority and request id a call sets, a failure a 502 and an
expiry a 504. Their bad bodies are in ``test_ingress_api_errors``, their retries in
``test_ingress_api_requests``."""

from __future__ import annotations

import pytest
from switchyard.contracts.messages import ClassificationPayload

from tests.service.ingress_support import (
    Replica,
    Stack,
    assert_error,
    features,
    ingress_fixture,  # noqa: F401 (the ``ingress`` fixture)
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)

# -- classification ----------------------------------------------------------------------


async def test_infer_answers_the_label(stack: Stack, ingress: Replica) -> None:
    response = await ingress.client.post("/v1/apps/wine/infer", json={"features": features()})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["app"] == "wine"
    assert body["label"] == 1
    assert body["class_name"] == "class_1"
    assert body["probabilities"] == [0.1, 0.8, 0.1]
    assert body["variant"] == "mlp-small"
    assert body["worker_id"] == "worker-1"
    assert body["emulated"] is False
    assert body["deadline_met"] is True
    assert body["timeline"]["finished_s"] is not None
    [request] = stack.worker.requests_with_id(body["request_id"])
    assert isinstance(request.payload, ClassificationPayload)
    assert request.payload.features == features()
    assert request.deadline_s == pytest.approx(request.arrival_s + 0.150)
    assert body["deadline_s"] == pytest.approx(request.deadline_s)


async def test_infer_takes_deadline_priority_and_request_id(stack: Stack, ingress: Replica) -> None:
    body = {"features": features(), "deadline_ms": 40, "priority": 900, "request_id": "wine-1"}
    response = await ingress.client.post("/v1/apps/wine/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["request_id"] == "wine-1"
    [request] = stack.worker.requests_with_id("wine-1")
    assert request.priority == 900
    assert request.deadline_s == pytest.approx(request.arrival_s + 0.040)


async def test_infer_failure_is_a_502_and_expiry_a_504(ingress: Replica) -> None:
    failed = await ingress.client.post(
        "/v1/apps/wine/infer", json={"features": features(), "request_id": "FAIL-1"}
    )
    assert_error(failed, 502, param=None, names="CUDA out of memory")
    expired = await ingress.client.post(
        "/v1/apps/wine/infer", json={"features": features(), "request_id": "EXPIRE-1"}
    )
    error = assert_error(expired, 504, param=None, names="EXPIRE-1")
    assert error["code"] == "deadline_expired"
    assert expired.json()["switchyard"]["status"] == "expired"
