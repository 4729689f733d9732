"""The HTTP server's own settings (the engine's live in pagedserve.core.config)."""

from __future__ import annotations

import json
from dataclasses import dataclass

TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral")
REASONING_PARSERS = ("auto", "none", "think", "deepseek_r1", "qwen3")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0 for every interface)."""
    port: int = 8000
    """TCP port to listen on (0: any free port)."""
    api_key: str | None = None
    """Clients must send `Authorization: Bearer KEY` (default: env PAGEDSERVE_API_KEY). /health
    and /metrics stay open."""
    served_model_name: tuple[str, ...] = ()
    """Names clients may send as `model` (one or more, as vLLM takes them); /v1/models lists
    each. The first is the one responses, metrics' model_name, KV events' {model} and adapters'
    parent carry. Default: the model's own name. MODEL goes before the flag, or right after
    its names (with no MODEL before it, the flag's last word is MODEL if it names one: a file
    or folder, a .gguf path or a hub id org/name)."""
    allowed_origins: tuple[str, ...] = ()
    """Origins allowed by CORS (e.g. http://localhost:3000, or *). Default: none."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest request body accepted; larger ones get 413."""
    graceful_timeout: float = 30.0
    """Seconds SIGTERM waits for requests in flight before stopping."""
    ui: bool = True
    """Serve the built-in chat page and live server view at / (--no-ui turns it off)."""
    log_level: str = "info"
    """Logging level: debug, info, warning or error."""
    access_log: bool = False
    """Log one line per request when its response ends (peer, method, path, status, seconds,
    and the request's X-Request-Id, as every log line of a request carries it), whatever
    --log-level."""
    tool_call_parser: str = "auto"
    """How the model writes tool calls under tool_choice auto: hermes (<tool_call>),
    llama3_json, mistral ([TOOL_CALLS]), or auto: from the chat template (hermes, with a tools
    prompt pagedserve adds, for templates without a tool section)."""
    reasoning_parser: str = "auto"
    """Split <think>...</think> into reasoning_content: think (also deepseek_r1, qwen3), none,
    or auto: when the chat template writes </think>."""
    response_store_size: int = 1000
    """Most /v1/responses responses kept in memory for previous_response_id, GET, DELETE and
    cancel (0: none). Per process; the least recently used goes first."""
    response_store_mb: int = 256
    """Most megabytes of stored responses' JSON (with their conversations)."""
    response_store_ttl: float = 3600.0
    """Seconds a stored response is kept after it was written."""
    allow_runtime_lora_updating: bool = False
    """Accept POST /v1/load_lora_adapter and /v1/unload_lora_adapter (also set by vLLM's
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)."""
    allowed_local_media_path: str | None = None
    """Directory whose files requests may name as file:// image URLs (default: none may)."""
    limit_mm_per_prompt: int = 8
    """Most images one prompt may carry, given as vLLM's JSON '{"image": N}' (or N)."""
    media_fetch_timeout: float = 10.0
    """Seconds the server waits for an http(s) image URL (all of it) before a 400."""
    media_max_bytes: int = 20 * 1024 * 1024
    """Largest image (data: URL, download or file) accepted, in bytes."""

    def __post_init__(self) -> None:
        if isinstance(self.served_model_name, str):  # one name given from Python
            object.__setattr__(self, "served_model_name", (self.served_model_name,))
        _check_names(self.served_model_name)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.graceful_timeout < 0:
            raise ValueError(f"graceful_timeout must be >= 0, got {self.graceful_timeout}")
        if self.response_store_size < 0 or self.response_store_mb < 0:
            raise ValueError("response_store_size and response_store_mb must be >= 0")
        if self.response_store_ttl <= 0:
            raise ValueError(f"response_store_ttl must be > 0, got {self.response_store_ttl}")
        if self.limit_mm_per_prompt < 0:
            raise ValueError(f"limit_mm_per_prompt must be >= 0, got {self.limit_mm_per_prompt}")
        if self.media_fetch_timeout <= 0 or self.media_max_bytes < 1:
            raise ValueError("media_fetch_timeout must be > 0 and media_max_bytes >= 1")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {TOOL_CALL_PARSERS}, got {self.tool_call_parser!r}"
            )
        if self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {REASONING_PARSERS}, got {self.reasoning_parser!r}"
            )
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(
                f"log_level must be debug, info, warning or error, got {self.log_level!r}"
            )

    @property
    def model_name(self) -> str | None:
        """The name responses carry: the first served_model_name (None: the model's own)."""
        return self.served_model_name[0] if self.served_model_name else None


def _check_names(names: tuple[str, ...]) -> None:
    if not all(names):
        raise ValueError("served_model_name: a name must not be empty")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"served_model_name: {', '.join(twice)} given more than once")


def parse_mm_limit(text: str) -> int:
    """--limit-mm-per-prompt: vLLM's JSON '{"image": N}' (other modalities only at 0), or N."""
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(
            f'limit_mm_per_prompt must be JSON like {{"image": 4}}, got {text!r}'
        ) from None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, dict) or not all(isinstance(v, int) for v in value.values()):
        raise ValueError(f'limit_mm_per_prompt must be JSON like {{"image": 4}}, got {text!r}')
    others = [k for k, v in value.items() if k != "image" and v]
    if others:
        raise ValueError(f"limit_mm_per_prompt: only images are taken, not {others}")
    return int(value.get("image", 0))
