"""POST /v1/responses (and GET / DELETE / cancel of stored ones) on the chat machinery.

A Responses request becomes a chat request (responses_input), which ChatService prepares as
it prepares its own: template, tools, grammar, reasoning. One generation loop (`_drive`) serves
the three ways of answering: a whole JSON Response, an SSE stream of Response events, and a
background run that GET polls. Every run is registered while it lives, so /cancel can stop it
(within one engine step of its next token); every exit path closes its engine stream, which
aborts the request and frees its pages.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.engine_client import RequestStream
from pagedserve.core.outputs import RequestOutput
from pagedserve.openai_compat.chat.output import OutputPlan
from pagedserve.openai_compat.chat.serving import ChatService, Prepared, chat_chars
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.media import load_message_images
from pagedserve.openai_compat.common.serving import (
    OFF_LOOP_CHARS,
    ServingContext,
    engine_errors,
    now,
    off_loop,
    sampling_params,
    stream_outputs,
)
from pagedserve.openai_compat.common.streaming import SSEResponse, until_disconnect
from pagedserve.openai_compat.common.structured import compile_off_loop
from pagedserve.openai_compat.responses.input import chat_request, with_ids
from pagedserve.openai_compat.responses.output import OutputBuilder, base_response, usage
from pagedserve.openai_compat.responses.protocol import ResponsesRequest
from pagedserve.openai_compat.responses.store import ResponseStore, StoredResponse

logger = logging.getLogger("pagedserve.server")
T = TypeVar("T")

CANCEL_WAIT_S = 30.0
"""How long /cancel waits for a run to stop before answering with what it has."""
_CHAT_PARAMS = {"messages": "input", "response_format": "text.format"}
_TERMINAL = ("completed", "incomplete", "failed", "cancelled")
_FINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete"}


@dataclass
class _Run:
    """One response being generated."""

    response: dict[str, Any]
    """The live Response object (GET and the final event show it)."""
    entry: StoredResponse
    stream: RequestStream
    plan: OutputPlan
    num_prompt: int
    summary: bool
    store: bool
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by /cancel."""
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ResponsesService:
    def __init__(self, ctx: ServingContext, store: ResponseStore) -> None:
        self.ctx = ctx
        self.store = store
        self.chat = ChatService(ctx)
        self.running: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def create(self, req: ResponsesRequest, receive: Receive) -> Response:
        run = await self._start(req)
        if req.background:
            task = asyncio.ensure_future(self._background(run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return JSONResponse({**run.response, "status": "queued"})
        if req.stream:
            return SSEResponse(self._frames(run))
        return JSONResponse(await until_disconnect(receive, self._collect(run)))

    async def _start(self, req: ResponsesRequest) -> _Run:
        """Everything that can refuse the request, before any header is sent."""
        ctx = self.ctx.for_model(req.model)  # an adapter's name runs that adapter
        history = self._history(req.previous_response_id)
        items = with_ids(req.input_items())
        chat = chat_request(req, history + items)
        with _chat_params():
            images = await load_message_images(chat.messages, ctx.engine, ctx.media)
            chars = chat_chars(chat.messages) + (OFF_LOOP_CHARS if images else 0)
            prep: Prepared = await off_loop(chars, self.chat.prepare, chat, images)
            await compile_off_loop(ctx.engine, prep.spec)
            skip = False if prep.keep_special_tokens else None
            vocab_size = ctx.engine.tokenizer.vocab_size
            params = sampling_params(chat, chat.output_limit(), None, None, vocab_size,
                                     prep.spec, skip)  # fmt: skip
            ctx.admit(prep.text_ids or prep.prompt_ids, "input")
            response_id = f"resp_{secrets.token_hex(24)}"
            [stream] = ctx.start(response_id, [prep.prompt_ids], params, "input", prep.multimodal)
        response = base_response(req, response_id, ctx.model_name, now())
        entry = StoredResponse(response, items, history + items)
        summary = bool(req.reasoning and (req.reasoning.summary or req.reasoning.generate_summary))
        run = _Run(response, entry, stream, prep.output, len(prep.prompt_ids), summary,
                   req.store is not False)  # fmt: skip
        if req.background:
            response["status"] = "queued"
        self.running[response_id] = run
        if run.store:
            self.store.put(response_id, entry)
        return run

    def _history(self, previous_id: str | None) -> list[dict[str, Any]]:
        if previous_id is None:
            return []
        entry = self.store.get(previous_id)
        if entry is None:
            raise errors.invalid(
                f"Previous response with id '{previous_id}' not found.",
                "previous_response_id",
                "previous_response_not_found",
            )
        if entry.response["status"] not in _TERMINAL:
            raise errors.invalid(
                f"Previous response with id '{previous_id}' is still in progress.",
                "previous_response_id",
            )
        return entry.conversation

    async def _drive(self, run: _Run) -> AsyncIterator[list[dict[str, Any]]]:
        """Generate, yielding batches of stream events; when it ends (however), the run's
        response is final, stored, and the run unregistered."""
        parser = run.plan.new_choice()
        builder = OutputBuilder(run.summary)
        reason, counts = None, [0, 0]  # generated tokens, cached prompt tokens
        outputs = self._outputs(run)
        run.response["status"] = "in_progress"
        status, error = "cancelled", None
        try:
            with engine_errors("input"):
                async for out in outputs:
                    counts[1] = out.metrics.num_cached_tokens if out.metrics else counts[1]
                    for o in out.outputs:
                        counts[0] += len(o.token_ids)
                        reason = o.finish_reason or reason
                        builder.feed(parser.feed(o.text, final=o.finish_reason is not None))
                    yield builder.take()
            if reason is not None:
                status = "incomplete" if reason == "length" else "completed"
        except errors.APIError as exc:
            status, error = "failed", {"code": _error_code(exc), "message": exc.message}
            raise
        except Exception:
            status, error = "failed", {"code": "server_error", "message": "generation failed"}
            raise
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
            self._finish(run, builder, status, error, counts)
        yield builder.take()

    async def _outputs(self, run: _Run) -> AsyncIterator[RequestOutput]:
        """The run's outputs until it ends or /cancel stops it. The wait for the first one
        (queue, prefill) races the cancel; later ones come every engine step, and the cancel
        is read between them. Ending early closes the engine stream (an abort)."""
        outputs = stream_outputs([run.stream], self.ctx.metrics)
        try:
            first = await _unless_set(outputs.__anext__(), run.cancel)
            if first is None:
                return
            yield first[1]
            while not run.cancel.is_set():
                try:
                    _, out = await outputs.__anext__()
                except StopAsyncIteration:
                    return
                yield out
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]

    def _finish(
        self,
        run: _Run,
        builder: OutputBuilder,
        status: str,
        error: dict[str, Any] | None,
        counts: list[int],
    ) -> None:
        items = builder.finish("completed" if status == "completed" else "incomplete")
        reasoning = "".join(
            part["text"] for item in items if item["type"] == "reasoning"
            for part in item["content"]
        )  # fmt: skip
        num_reasoning = len(self.ctx.engine.tokenizer.encode(reasoning)) if reasoning else 0
        response = run.response
        response.update(
            status=status,
            output=items,
            error=error,
            usage=usage(run.num_prompt, counts[0], counts[1], min(num_reasoning, counts[0])),
        )
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        if status == "completed":
            response["completed_at"] = int(time.time())
        run.entry.conversation = run.entry.conversation + items
        if run.store:
            self.store.update(response["id"], run.entry)
        self.running.pop(response["id"], None)
        run.done.set()

    async def _collect(self, run: _Run) -> dict[str, Any]:
        drive = self._drive(run)
        try:
            async for _ in drive:
                pass
        finally:
            await drive.aclose()  # type: ignore[attr-defined]
            self._abandon(run)
        return run.response

    def _abandon(self, run: _Run) -> None:
        """A run whose generation never started (its reader left first): abort it and record
        it cancelled, as a started one records itself."""
        if not run.done.is_set():
            run.stream.close()
            self._finish(run, OutputBuilder(run.summary), "cancelled", None, [0, 0])

    async def _background(self, run: _Run) -> None:
        try:
            await self._collect(run)
        except Exception:
            logger.exception("background response %s failed", run.response["id"])

    async def _frames(self, run: _Run) -> AsyncIterator[bytes]:
        """The SSE events of one run, numbered; a failure after the headers went out is an
        `error` event and then response.failed."""
        seq = 0

        def frame(event: dict[str, Any]) -> bytes:
            nonlocal seq
            event = {"type": event["type"], "sequence_number": seq, **event}
            seq += 1
            name: str = event["type"]
            return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

        snapshot = {**run.response, "status": "in_progress"}
        drive = self._drive(run)
        try:
            yield frame({"type": "response.created", "response": snapshot})
            yield frame({"type": "response.in_progress", "response": snapshot})
            async for events in drive:
                for event in events:
                    yield frame(event)
        except Exception as exc:
            if not isinstance(exc, errors.APIError):
                logger.exception("response %s failed while streaming", run.response["id"])
            error = run.response["error"] or {"code": "server_error", "message": str(exc)}
            yield frame({"type": "error", **error, "param": None})
        finally:
            await drive.aclose()  # type: ignore[attr-defined]
            self._abandon(run)
        status = run.response["status"]
        final = _FINAL_EVENTS.get(status, "response.failed" if status == "failed" else
                                  "response.incomplete")  # fmt: skip
        yield frame({"type": final, "response": run.response})

    def retrieve(self, response_id: str, query: dict[str, str]) -> dict[str, Any]:
        if query.get("stream", "false") != "false":
            raise errors.invalid("Streaming a stored response again is not supported.", "stream")
        return self._stored(response_id).response

    def delete(self, response_id: str) -> dict[str, Any]:
        if not self.store.delete(response_id):
            raise _not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def cancel(self, response_id: str) -> dict[str, Any]:
        run = self.running.get(response_id)
        if run is None:
            entry = self._stored(response_id)
            if not entry.response.get("background"):
                raise errors.invalid("Only background or in-flight responses can be cancelled.")
            return entry.response
        run.cancel.set()
        try:
            await asyncio.wait_for(run.done.wait(), CANCEL_WAIT_S)
        except TimeoutError:
            return {**run.response, "status": "cancelled"}
        return run.response

    def input_items(self, response_id: str, query: dict[str, str]) -> dict[str, Any]:
        items = list(self._stored(response_id).input_items)
        limit = _int_param(query.get("limit", "20"), "limit", 1, 100)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise errors.invalid("order must be asc or desc.", "order")
        if order == "desc":
            items.reverse()
        after = query.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise errors.invalid(f"No input item with id '{after}'.", "after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        return {"object": "list", "data": page, "first_id": first, "last_id": last,
                "has_more": len(items) > limit}  # fmt: skip

    def _stored(self, response_id: str) -> StoredResponse:
        """A stored response (a running one is stored from its start)."""
        entry = self.store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return entry

    async def shutdown(self) -> None:
        """Cancel the background runs (their engine requests abort)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _unless_set(work: Awaitable[T], event: asyncio.Event) -> T | None:
    """`work`'s result, or None once `event` is set first (`work` is then cancelled); a work
    that ends without a value (StopAsyncIteration) is None too."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return None
    try:
        return task.result()
    except StopAsyncIteration:
        return None


def _not_found(response_id: str) -> errors.APIError:
    return errors.APIError(404, f"Response with id '{response_id}' not found.",
                           type="invalid_request_error", param="response_id")  # fmt: skip


def _error_code(exc: errors.APIError) -> str:
    return "rate_limit_exceeded" if exc.status == 429 else "server_error"


def _int_param(value: str, name: str, low: int, high: int) -> int:
    if not value.isdigit() or not low <= int(value) <= high:
        raise errors.invalid(f"{name} must be an integer in [{low}, {high}].", name)
    return int(value)


class _chat_params:
    """Errors the chat machinery raises name chat's fields: rename them to the Responses ones."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, errors.APIError) and exc.param and exc.param.endswith(".image_url"):
            # the chat message's image part: the Responses input's input_image
            exc.message = f"An input_image ({exc.param} of the conversation): {exc.message}"
            exc.param = "input"
        if isinstance(exc, errors.APIError) and exc.param in _CHAT_PARAMS:
            old, new = exc.param, _CHAT_PARAMS[exc.param]
            exc.param = new
            exc.message = exc.message.replace(old, new)
