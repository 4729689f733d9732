"""/v1/models' cards: OpenAI's model object with what pagedserve adds, and each model's state
(`status.value`: loaded, loading, unloaded or failed, as llama.cpp's router reports it)."""

from __future__ import annotations

from typing import Any

from pagedserve.openai_compat.common.serving import ServingContext
from pagedserve.openai_compat.lora.serving import lora_cards
from pagedserve.openai_compat.model_pool import ModelState
from pagedserve.openai_compat.state import ServerState


def model_cards(state: ServerState) -> list[dict[str, Any]]:
    """Every model the server offers (503 while the start-up load runs: the single-model
    server's model is named once loaded)."""
    state.available()
    loaded = {name: services.ctx for name, services in state.pool.loaded()}
    cards = []
    for model in state.pool.states():
        ctx = loaded.get(model.name)
        if ctx is None:
            cards.append(_with_status(_card(state, model), model))
            continue
        for name in (ctx.model_name, *ctx.aliases):  # a card per served name (vLLM's list)
            cards.append(_with_status(_loaded_card(state, ctx, name), model))
        cards += lora_cards(ctx, state.started)  # `parent` the first name (lora/serving.py)
    return cards


def _with_status(card: dict[str, Any], model: ModelState) -> dict[str, Any]:
    card["status"] = {"value": model.status}
    if model.status == "failed" and model.error:
        card["status"]["error"] = model.error
    return card


def _card(state: ServerState, model: ModelState) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "model",
        "created": state.started,
        "owned_by": "pagedserve",
        "root": model.path,
        "parent": None,
    }


def _loaded_card(state: ServerState, ctx: ServingContext, name: str) -> dict[str, Any]:
    info = ctx.engine.model_info
    return {
        "id": name,
        "object": "model",
        "created": state.started,
        "owned_by": "pagedserve",
        "root": info.name,
        "parent": None,
        "max_model_len": info.max_model_len,
        # Greedy and seeded results depend on the request alone, not the batch (issue 16).
        "batch_invariant": info.batch_invariant,
        # What runs the weights, e.g. GGUF blocks kept quantized on the int8 kernels (issue 12).
        "weights": info.weights,
        # generate (chat, completions), embed (/v1/embeddings, issue 25) or score (/v1/rerank,
        # /v1/score, issue 40).
        "task": info.task,
    }
