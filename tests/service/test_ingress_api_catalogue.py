"""What the ingress lists and describes, over the in-memory bus with the fake worker of
:mod:`tests.service.ingress_support`: the LLM applications (``/v1/models``), the
classification applications (``/v1/apps``), the OpenAPI document and ``/healthz``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.service.ingress_support import (
    CHAT_MAX_PROMPT,
    WINE_FEATURES,
    Replica,
    ingress_fixture,  # noqa: F401 (the ``ingress`` fixture)
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)

# -- catalogue, OpenAPI, health -----------------------------------------------------------


async def test_models_lists_the_llm_applications(ingress: Replica) -> None:
    response = await ingress.client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["chat", "coder"]
    chat = body["data"][0]
    assert chat["object"] == "model"
    assert chat["owned_by"] == "switchyard"
    assert chat["switchyard"]["max_prompt_tokens"] == CHAT_MAX_PROMPT
    assert chat["switchyard"]["served_model"] == "llama-2-7b"
    # Token objectives: the workload class's defaults, or the application's own.
    assert (chat["switchyard"]["ttft_slo_s"], chat["switchyard"]["tpot_slo_s"]) == (1.0, 0.1)
    coder = body["data"][1]["switchyard"]
    assert (coder["ttft_slo_s"], coder["tpot_slo_s"]) == (0.25, 0.1)


async def test_one_model_is_retrieved_by_name_and_an_unknown_one_is_a_404(
    ingress: Replica,
) -> None:
    found = await ingress.client.get("/v1/models/chat")
    missing = await ingress.client.get("/v1/models/gpt-9")

    assert found.status_code == 200
    assert found.json()["id"] == "chat"
    assert found.json()["object"] == "model"
    assert found.json()["switchyard"]["served_model"] == "llama-2-7b"
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "model_not_found"
    assert "'gpt-9'" in error["message"]
    assert "chat" in error["message"]  # the served models are named


async def test_apps_lists_the_classification_applications(ingress: Replica) -> None:
    response = await ingress.client.get("/v1/apps")
    assert response.status_code == 200
    assert response.json()["data"] == [
        {
            "name": "wine",
            "feature_dim": WINE_FEATURES,
            "classes": ["class_0", "class_1", "class_2"],
            "deadline_ms": 150.0,
            "variants": ["mlp-small"],
        }
    ]


async def test_openapi_describes_every_endpoint(ingress: Replica) -> None:
    response = await ingress.client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/apps/{app}/infer",
        "/v1/requests/{request_id}",
        "/v1/models",
        "/v1/models/{model}",
        "/v1/apps",
        "/openapi.json",
        "/healthz",
        "/health",
    }
    schemas = document["components"]["schemas"]
    assert {"CompletionBody", "ChatBody", "InferBody", "SwitchyardOptions", "Error"} <= set(schemas)
    assert "deadline_ms" in schemas["SwitchyardOptions"]["properties"]
    # Every status a call can be answered with is declared (clients generate from it).
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/apps/{app}/infer"):
        declared = set(document["paths"][path]["post"]["responses"])
        assert {"200", "400", "404", "409", "413", "415", "429", "503", "504"} <= declared

    def refs(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    yield value
                else:
                    yield from refs(value)
        elif isinstance(node, list):
            for item in node:
                yield from refs(item)

    for ref in refs(document):  # every reference resolves
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


@pytest.mark.parametrize("path", ["/healthz", "/health"])
async def test_health_on_kubernetes_and_vllm_routes(ingress: Replica, path: str) -> None:
    # /health is where vLLM and SGLang answer, and where benchmark clients probe.
    response = await ingress.client.get(path)
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
