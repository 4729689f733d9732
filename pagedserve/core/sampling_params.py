"""Per-request sampling parameters (stdlib only). Validation raises ValueError naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "choice", "ebnf")


@dataclass(frozen=True)
class StructuredOutputs:
    """A constraint on the output (constrained decoding); equal specs share one compiled grammar."""

    kind: str
    """One of GRAMMAR_KINDS: a JSON schema, any JSON object, a regex, one of some strings, or an
    EBNF grammar (xgrammar's dialect)."""
    value: str = ""
    """The schema as JSON text, the regex, the choices as a JSON list, or the grammar text
    (empty for json_object)."""
    param: str = "response_format"
    """The request field it came from, named in errors."""

    def __post_init__(self) -> None:
        _check(self.kind in GRAMMAR_KINDS, self.param, f"kind must be one of {GRAMMAR_KINDS}")

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the compiled grammar (param only names errors)."""
        return (self.kind, self.value)


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    """Number of outputs for the prompt; they share the prompt's KV pages."""
    max_tokens: int | None = 16
    """Most tokens to generate; None: up to the context length."""
    min_tokens: int = 0
    """EOS and stop token ids are suppressed until this many tokens were generated."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1) disables top-k."""
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    """Same seed, same text, whatever else shares the batch."""
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    """None: no logprobs; k >= 0: the sampled token's logprob plus the top k alternatives."""
    prompt_logprobs: int | None = None
    """None: none; k >= 0: logprobs of each prompt token plus the top k (for echo)."""
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: StructuredOutputs | None = None
    """Constrain the output to a grammar; None: free text."""

    def __post_init__(self) -> None:
        _check(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        if self.max_tokens is not None:
            _check(self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}")
        _check(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens,
                "min_tokens",
                f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
            )
        _check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= -1, "top_k", f"must be -1, 0 or positive, got {self.top_k}")
        _check(0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2 <= value <= 2, name, f"must be in [-2, 2], got {value}")
        _check(
            self.repetition_penalty > 0,
            "repetition_penalty",
            f"must be > 0, got {self.repetition_penalty}",
        )
        for token_id, bias in self.logit_bias.items():
            _check(-100 <= bias <= 100, "logit_bias", f"bias for {token_id} must be in [-100, 100]")
        _check(
            len(self.stop) <= MAX_STOP_STRINGS,
            "stop",
            f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}",
        )
        _check(all(self.stop), "stop", "stop strings must not be empty")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check(
                    0 <= value <= MAX_LOGPROBS, name, f"must be in [0, {MAX_LOGPROBS}], got {value}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SamplingParamsError(ValueError):
    """A bad sampling parameter; `param` names it (the server puts it in the error envelope)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(param, message)
