"""Loading and unloading adapters through an engine, and their /v1/models cards.

Errors keep OpenAI's envelope: a file that does not parse, a rank above --max-lora-rank, a target
the model lacks, a name taken: 400 naming it (the engine keeps serving); an unknown name on
unload: 404 model_not_found; without --allow-runtime-lora-updating: 400 (vLLM's words)."""

from __future__ import annotations

import time
from typing import Any

from pagedserve.core.engine_client import EngineClient
from pagedserve.core.lora_request import LoRAError, LoRANotFoundError
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.serving import ServingContext

DISABLED = (
    "Runtime LoRA updating is off: start the server with --allow-runtime-lora-updating "
    "(or VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)."
)


async def load_adapter(engine: EngineClient, name: str, path: str) -> JSONResponse:
    """Load `path` as `name`; the answer says how long it took."""
    started = time.perf_counter()
    try:
        await engine.load_lora(name, path)
    except LoRAError as exc:
        raise errors.invalid(str(exc), "lora_path", "invalid_lora_adapter") from exc
    seconds = time.perf_counter() - started
    return JSONResponse({"object": "lora_adapter", "lora_name": name, "loaded": True,
                         "load_seconds": round(seconds, 4)})  # fmt: skip


async def unload_adapter(engine: EngineClient, name: str) -> JSONResponse:
    try:
        await engine.unload_lora(name)
    except LoRANotFoundError as exc:
        raise errors.model_not_found(name) from exc
    except LoRAError as exc:
        raise errors.invalid(str(exc), "lora_name") from exc
    return JSONResponse({"object": "lora_adapter", "lora_name": name, "unloaded": True})


def lora_cards(ctx: ServingContext, created: int) -> list[dict[str, Any]]:
    """A card per adapter loaded on ctx's engine, `parent` its base model (vLLM's shape)."""
    return [
        {
            "id": lora.lora_name,
            "object": "model",
            "created": created,
            "owned_by": "pagedserve",
            "root": lora.lora_path,
            "parent": ctx.model_name,
            "status": {"value": "loaded"},
        }
        for lora in ctx.engine.list_loras()
    ]
