"""The bodies of POST /v1/rerank and /v2/rerank (Cohere's and Jina's: `query`, `documents` as strings or
objects with `text`, `top_n`, `return_documents`) and POST /v1/score (vLLM's: `text_1` against
`text_2`, each a string or a list). Bounds are in the schema, so /openapi.json publishes exactly
what is accepted.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from pagedserve.openai_compat.common.protocol import FieldError, _no_nul, _Strict

MAX_DOCUMENTS = 1000
"""Cohere's limit on the documents of one rerank call (also the most pairs of one score call)."""

Text = Annotated[str, Field(min_length=1), AfterValidator(_no_nul)]


class RerankDocument(_Strict):
    """A document as an object: its `text` is ranked; other fields come back as they were."""

    model_config = ConfigDict(extra="allow", strict=True)
    text: Text


class RerankRequest(_Strict):
    query: Text
    documents: Annotated[list[Text | RerankDocument], Field(min_length=1, max_length=MAX_DOCUMENTS)]
    model: str | None = None
    top_n: int | None = Field(default=None, ge=1)
    """Return only the best `top_n` results (all of them when larger than the documents)."""
    return_documents: bool = True
    """Each result carries its `document` (Jina's and vLLM's default; Cohere v2 sends false)."""
    max_chunks_per_doc: int | None = Field(default=None, ge=1)
    """Cohere v1's; accepted and unused (a document is scored whole, or refused as too long)."""
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    """Cohere v2's: each document cut to its first `max_tokens_per_doc` tokens before scoring
    (without it a pair too long for the context is a 400)."""
    user: str | None = None

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def document(self, index: int) -> dict[str, Any]:
        """Document `index` as a result carries it: {"text": ...} or the object as sent."""
        doc = self.documents[index]
        return {"text": doc} if isinstance(doc, str) else doc.model_dump()


Texts = Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_DOCUMENTS)]


class ScoreRequest(_Strict):
    text_1: Texts
    """The query (or queries, one per `text_2`)."""
    text_2: Texts
    """The documents scored against `text_1`."""
    model: str | None = None
    user: str | None = None

    @model_validator(mode="after")
    def check_pairs(self) -> ScoreRequest:
        num_1 = 1 if isinstance(self.text_1, str) else len(self.text_1)
        num_2 = 1 if isinstance(self.text_2, str) else len(self.text_2)
        if num_1 > 1 and num_1 != num_2:
            raise FieldError(
                "text_1",
                f"holds {num_1} texts and text_2 {num_2}: give one text_1, or as many as text_2",
            )
        return self

    def pairs(self) -> list[tuple[str, str]]:
        """(text_1, text_2) per score: one against many, or pairwise."""
        firsts = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        seconds = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        return list(zip(firsts, seconds, strict=True))


RERANK_REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/rerank": RerankRequest,
    "/v2/rerank": RerankRequest,
    "/v1/score": ScoreRequest,
}
