"""Chat templates: a model's jinja2 template rendered in a sandbox, the way transformers does.

The environment matches `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text), so the prompt text is
the same. It is jinja2's immutable sandbox, and reaching for Python internals
(`''.__class__.__mro__`) fails instead of rendering as empty text.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
from jinja2 import ext, meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pagedserve.core.tokenizers.load import Tokenizer


class ChatTemplateError(ValueError):
    """The template raised or could not render (the server answers 400)."""


class NoChatTemplateError(ValueError):
    """Chat was asked of a model that has no chat template."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(
            message
            or "this model has no chat template: use the completions endpoint, or give one "
            "with --chat-template <file>"
        )


class _StrictSandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        # The default returns an Undefined that prints as "": make the attempt an error.
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is unsafe"
        )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
    sort_keys: bool = False,
) -> str:  # fmt: skip
    # jinja2's own tojson escapes HTML characters; templates expect plain json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _Generation(ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): renders the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _environment() -> jinja2.Environment:
    env = _StrictSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols, _Generation]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str | None, eos_token: str | None) -> None:
        self.source = source
        self._special = {"bos_token": bos_token, "eos_token": eos_token}
        env = _environment()
        try:
            self._template = env.from_string(source)
            self.variables = frozenset(meta.find_undeclared_variables(env.parse(source)))
            """The variables the template reads (e.g. `tools`: it renders tool definitions)."""
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        context = {**self._special, **kwargs}
        context.update(messages=messages, add_generation_prompt=add_generation_prompt, tools=tools)
        try:
            return self._template.render(**context)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def load_chat_template(
    tokenizer: Tokenizer, override_path: Path | None = None
) -> ChatTemplate | None:
    """The override file's template (a .jinja file, or JSON with a "chat_template" key) if
    given, else the model's own; None when there is neither."""
    source = tokenizer.chat_template
    if override_path is not None:
        source = _read_override(Path(override_path))
    if source is None:
        return None
    return ChatTemplate(source, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)


def _read_override(path: Path) -> str:
    if not path.is_file():
        raise ValueError(f"chat_template: no such file {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        template = json.loads(text).get("chat_template")
        if not isinstance(template, str):
            raise ValueError(f"chat_template: {path} has no string 'chat_template' key")
        return template
    return text
