"""Schemathesis against a live server's /openapi.json: what one fuzzed call must satisfy.

Shared by the bounded CI run (test_fuzz_schema.py) and the long run (bench/serving/fuzz_long.py).
Bodies are generated from the published schema, both valid ones (positive) and ones that break
it (negative); only the sizes that cost engine time are clamped, so every call stays cheap.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from schemathesis import GenerationMode

from pagedserve.openai_compat.openapi import ROUTE_MODELS

MAX_TOKENS_CAP = 2
N_CAP = 2
PROMPT_LIST_CAP = 4


def load_schema(base_url: str) -> Any:
    return schemathesis.openapi.from_url(base_url + "/openapi.json")


def post_operations(schema: Any) -> list[Any]:
    """The POST operations (the GET ones take no input worth fuzzing)."""
    ops = [result.ok() for result in schema.get_all_operations()]
    return [op for op in ops if op.method.upper() == "POST"]


GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
"""Routes that answer errors in Anthropic's envelope."""


def clamp(body: Any, path: str = "/v1/chat/completions") -> Any:
    """Bound the engine work of a generated body without changing its validity: positive
    sizes are lowered to small positive sizes, absent or null max_tokens get a small one."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if type(value) in (int, float) and value > MAX_TOKENS_CAP:
            body[name] = MAX_TOKENS_CAP
    # /v1/messages requires max_tokens: a body without it must stay the 400 it is.
    if path not in ("/v1/responses", "/v1/messages") and ("prompt" in body or "messages" in body):
        # Absent or null means "up to the context length": ~1000 tokens, minutes on a CPU.
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = MAX_TOKENS_CAP
    if path == "/v1/responses" and body.get("max_output_tokens") is None:
        body["max_output_tokens"] = MAX_TOKENS_CAP
    if type(body.get("n")) is int and body["n"] > N_CAP:
        body["n"] = N_CAP
    if type(body.get("min_tokens")) is int and body["min_tokens"] > MAX_TOKENS_CAP:
        body["min_tokens"] = MAX_TOKENS_CAP
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        body["prompt"] = prompt[:PROMPT_LIST_CAP]
    return body


def envelope_problem(payload: Any) -> str | None:
    """Why `payload` is not OpenAI's error envelope, or None when it is."""
    if not isinstance(payload, dict) or set(payload) != {"error"}:
        return f"not an error envelope: {str(payload)[:300]}"
    error = payload["error"]
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        return f"error object has the wrong keys: {str(error)[:300]}"
    if not (isinstance(error["message"], str) and error["message"]):
        return "error.message is not a non-empty string"
    if not isinstance(error["type"], str):
        return "error.type is not a string"
    if any(error[k] is not None and not isinstance(error[k], str) for k in ("param", "code")):
        return "error.param/code is neither a string nor null"
    return None


def anthropic_envelope_problem(payload: Any) -> str | None:
    """Why `payload` is not Anthropic's error envelope, or None when it is."""
    if not isinstance(payload, dict) or set(payload) != {"type", "error"}:
        return f"not an Anthropic error envelope: {str(payload)[:300]}"
    error = payload["error"]
    if (
        payload["type"] != "error"
        or not isinstance(error, dict)
        or set(error) != {"type", "message"}
    ):
        return f"error object has the wrong keys: {str(payload)[:300]}"
    if not (isinstance(error["message"], str) and error["message"]):
        return "error.message is not a non-empty string"
    if not isinstance(error["type"], str):
        return "error.type is not a string"
    return None


def stream_problem(text: str) -> str | None:
    """A 200 event stream must not carry a server-error frame: chat's error object, the
    Responses API's `error` event / response.failed with code server_error, or the Messages
    API's `error` event of type api_error. Frames may carry an `event:` line before their
    `data:` line (the Responses and Messages APIs' do)."""
    for frame in text.split("\n\n"):
        data = next((ln[6:] for ln in frame.split("\n") if ln.startswith("data: ")), "")
        if data.startswith("{") and '"error"' in data:
            payload = orjson.loads(data)
            if payload.get("type") == "response.failed":
                payload = payload.get("response") or {}
            error = payload.get("error") if payload.get("type") != "error" else payload
            if isinstance(error, dict) and isinstance(error.get("error"), dict):
                error = error["error"]  # Anthropic's error event: {"type": "error", "error": ...}
            kinds = ("server_error", "api_error")
            if isinstance(error, dict) and {error.get("type"), error.get("code")} & set(kinds):
                return f"server error frame mid-stream: {data[:300]}"
    return None


def response_problem(response: schemathesis.Response, path: str = "") -> str | None:
    """Why this response breaks the contract (no 5xx, 4xx in the API's envelope), or None."""
    status = response.status_code
    if status >= 500:
        return f"{status}: {response.text[:300]}"
    if 400 <= status < 500:
        check = anthropic_envelope_problem if path in ANTHROPIC_PATHS else envelope_problem
        try:
            return check(response.json())
        except ValueError:
            return f"{status} body is not JSON: {response.text[:300]}"
    content_type = response.headers.get("content-type") or [""]
    if content_type[0].startswith("text/event-stream"):
        return stream_problem(response.text)
    return None


def _strictly_invalid(path: str, body: Any) -> bool:
    if path not in ROUTE_MODELS:
        return True  # no body (e.g. POST /v1/responses/{response_id}/cancel): the path broke it
    try:
        ROUTE_MODELS[path].model_validate(body, strict=True)
    except ValidationError:
        return True
    return False


@dataclass
class FuzzReport:
    """What a run saw: status counts per operation and mode, and every contract break."""

    statuses: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    schema_gaps: list[str] = field(default_factory=list)
    """Schema-breaking bodies served although even strict validation accepts them: the
    published schema is narrower than what the server validates."""
    coerced: list[str] = field(default_factory=list)
    """Schema-breaking bodies served because lax validation coerced a value ("5" -> 5)."""

    @property
    def num_cases(self) -> int:
        return sum(self.statuses.values())


def fuzz_operation(
    op: Any, base_url: str, mode: GenerationMode, max_examples: int, report: FuzzReport,
    derandomize: bool = True,
) -> None:  # fmt: skip
    """Call `op` with `max_examples` generated bodies; record statuses and problems (never
    raises for a contract break, so one run reports all of them)."""
    session = requests.Session()

    @settings(max_examples=max_examples, deadline=None, derandomize=derandomize,
              database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=op.as_strategy(generation_mode=mode), _=st.just(None))
    def one(case: Any, _: None) -> None:
        if op.path in GENERATION_PATHS:  # /tokenize has no max_tokens to clamp
            case.body = clamp(case.body, op.path)
        try:
            response = case.call(base_url=base_url, session=session, timeout=120)
        except requests.RequestException as exc:
            body = str(case.body)[:300]
            report.problems.append(f"{op.label} {mode.value} body={body}: {type(exc).__name__}")
            return
        report.statuses[(op.label, mode.value, response.status_code)] += 1
        problem = response_problem(response, op.path)
        body = str(case.body)[:300]
        if problem is not None:
            report.problems.append(f"{op.label} {mode.value} body={body}: {problem}")
        if mode is GenerationMode.NEGATIVE and response.status_code < 400:
            gaps = report.coerced if _strictly_invalid(op.path, case.body) else report.schema_gaps
            gaps.append(f"{op.label} body={body}")

    one()
