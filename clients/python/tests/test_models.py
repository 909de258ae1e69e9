"""The models are the OpenAPI document's schemas: the same fields, the same required
ones; and the document the server serves is the committed one."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest

from tollgate._models import MODELS, Model

from .conftest import REPO, Server

DOCUMENT = REPO / "openapi.json"


def schemas() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(DOCUMENT.read_text())["components"]["schemas"]
    return result


def own_fields(model: type[Model]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(model) if f.name != "extra"]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.schema_name)
def test_each_model_is_its_schema(model: type[Model]) -> None:
    schema = schemas()[model.schema_name]
    fields = own_fields(model)
    assert {f.name for f in fields} == set(schema["properties"]), model.schema_name
    required = {
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert required == set(schema.get("required", [])), model.schema_name
    # A model keeps unknown fields exactly when its schema allows them.
    keeps_extra = any(f.name == "extra" for f in dataclasses.fields(model))
    open_schema = schema.get("additionalProperties", True) is not False
    if not open_schema:
        assert not keeps_extra, model.schema_name


#: Schemas the client writes without a model: the WebSocket messages it sends (a
#: ``oneOf`` of three small objects, written as dicts by the follower).
UNMODELLED = {"WsClientMessage"}


def test_every_body_schema_has_a_model() -> None:
    modelled = {m.schema_name for m in MODELS}
    assert set(schemas()) == modelled | UNMODELLED


def test_the_server_serves_these_schemas(server: Server) -> None:
    """The document the running server serves has the same fields and required fields
    for every schema the client models (so the models match the server too)."""
    served = httpx.get(f"{server.url}/api/openapi.json", timeout=10).json()

    def shape(document: dict[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
        return {
            name: (sorted(schema.get("properties", {})), sorted(schema.get("required", [])))
            for name, schema in document.items()
            if name in {m.schema_name for m in MODELS}
        }

    assert shape(served["components"]["schemas"]) == shape(schemas())
