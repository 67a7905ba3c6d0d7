"""`GET /openapi.json` of a real `corral serve` is a valid OpenAPI 3.1 document (checked by
`openapi-spec-validator` against the specification's schema, references resolved) that
describes the routes this SDK calls, with their schemas."""

from __future__ import annotations

import httpx
from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator


def test_the_document_is_valid_openapi_3_1(corral_url: str) -> None:
    doc = httpx.get(f"{corral_url}/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    validate(doc, cls=OpenAPIV31SpecValidator)


def test_the_calls_of_the_sdk_are_described(corral_url: str) -> None:
    doc = httpx.get(f"{corral_url}/openapi.json").json()
    paths = doc["paths"]
    schemas = doc["components"]["schemas"]
    wanted = {
        "/v1/sandboxes/{id}/processes": {"get", "post"},
        "/v1/sandboxes/{id}/processes/{pid}/output": {"get"},
        "/v1/sandboxes/{id}/processes/{pid}/input": {"post"},
        "/v1/sandboxes/{id}/processes/{pid}/close-stdin": {"post"},
        "/v1/sandboxes/{id}/processes/{pid}/signal": {"post"},
        "/v1/sandboxes/{id}/processes/{pid}/resize": {"post"},
        "/v1/sandboxes/{id}/contexts": {"get", "post"},
        "/v1/sandboxes/{id}/contexts/{context}": {"delete"},
        "/v1/sandboxes/{id}/contexts/{context}/restart": {"post"},
        "/v1/sandboxes/{id}/files:stat": {"get"},
        "/v1/sandboxes/{id}/pause": {"post"},
        "/v1/sandboxes/{id}/resume": {"post"},
        "/v1/sandboxes/{id}/ports/{port}/{path}": {"get", "post"},
    }
    for path, methods in wanted.items():
        assert methods <= set(paths.get(path, {})), path
    start = paths["/v1/sandboxes/{id}/processes"]["post"]
    body = start["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body == "#/components/schemas/StartProcessRequest"
    assert {"cmd", "args", "cwd", "env", "tag", "stdin", "pty"} <= set(schemas["StartProcessRequest"]["properties"])
    assert "application/x-ndjson" in start["responses"]["200"]["content"]
    assert {"start", "stdout", "end"} <= {
        v["properties"]["type"]["enum"][0] for v in schemas["OutputEvent"]["oneOf"]
    }
    params = {(p["name"], p["in"]) for p in paths["/v1/sandboxes/{id}/processes/{pid}/signal"]["post"]["parameters"]}
    assert params == {("id", "path"), ("pid", "path")}
    stat = {(p["name"], p["in"]) for p in paths["/v1/sandboxes/{id}/files:stat"]["get"]["parameters"]}
    assert stat == {("id", "path"), ("path", "query")}
    listed = paths["/v1/sandboxes/{id}/contexts"]["get"]["responses"]["200"]["content"]["application/json"]
    assert listed["schema"]["$ref"] == "#/components/schemas/ContextList"
