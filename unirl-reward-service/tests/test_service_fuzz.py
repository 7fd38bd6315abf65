"""Fuzz the app against its own published OpenAPI schema (schemathesis): no 5xx, every
status code and body documented, schema-invalid bodies rejected with 4xx."""

from __future__ import annotations

import itertools

import pytest

schemathesis = pytest.importorskip(
    "schemathesis", reason="pip install schemathesis (unirl-reward-service[dev]) for the fuzz test"
)
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from unirl_reward_service import create_app  # noqa: E402

TOKEN = "fuzz-token"
CONFIG = {
    "server": {
        "max_request_bytes": 200_000,
        "max_batch_size": 8,
        "max_image_pixels": 128 * 128,
        "require_auth": False,
    },
    "rewards": {
        "jpeg": {"_target_": "unirl.reward.local.JpegCompressibility", "timeout_s": 10},
        "stats": {"_target_": "unirl.reward.local.ImageStats", "timeout_s": 10},
    },
}
# positive_data_acceptance is left out on purpose: a schema-valid string need not be a
# decodable PNG, so the server rightly answers 422 to most generated "valid" bodies.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def app():
    app = create_app(CONFIG)
    yield app
    app.state.reward_server.close()


@pytest.fixture(scope="module")
def api_schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def secured_schema():
    server = {**CONFIG["server"], "auth_token": TOKEN, "require_auth": True}
    app = create_app({**CONFIG, "server": server})
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    app.state.reward_server.close()


_ALTERNATE = itertools.count()
schema = schemathesis.pytest.from_fixture("api_schema")
secured = schemathesis.pytest.from_fixture("secured_schema")
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,
)


@schema.parametrize()
@FUZZ
def test_no_server_errors_and_schema_conformance(case):
    case.call_and_validate(checks=CHECKS)


@secured.parametrize()
@FUZZ
def test_no_server_errors_with_auth_on(case):
    # Every other case carries the right token: 401 and 2xx answers must both be documented.
    if next(_ALTERNATE) % 2 == 0:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {TOKEN}"}
    case.call_and_validate(checks=CHECKS)


def test_schema_documents_every_answer(app):
    spec = app.openapi()
    score = spec["paths"]["/score"]["post"]
    assert set(score["responses"]) == {"200", "400", "404", "408", "413", "422", "503"}
    for code in ("400", "404", "408", "413", "422", "503"):
        ref = score["responses"][code]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorResponse")
    request = spec["components"]["schemas"]["ScoreRequest"]
    assert request["additionalProperties"] is False
    assert set(request["properties"]) == {
        "reward",
        "rewards",
        "images",
        "videos",
        "sources",
        "fps",
        "prompts",
        "metadata",
    }
    assert set(spec["paths"]) == {"/health", "/rewards", "/score"}
