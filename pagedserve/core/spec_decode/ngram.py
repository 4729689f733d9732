"""Prompt lookup: propose the tokens that followed the sequence's last n tokens where those n
tokens occurred before in its own prompt and output (n from ngram_max down to ngram_min).

One NgramIndex per sequence maps every n-gram seen so far to where it last ended, updated
incrementally as tokens arrive, so a proposal costs O(ngram_max) dict lookups however long
the context is.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    def __init__(self, prompt_token_ids: Sequence[int], ngram_min: int, ngram_max: int) -> None:
        assert 1 <= ngram_min <= ngram_max
        self._sizes = range(ngram_max, ngram_min - 1, -1)  # longest first
        self._tokens: list[int] = list(prompt_token_ids)
        self._num_prompt = len(self._tokens)
        # n -> n-gram -> the position just after its latest occurrence that has a successor
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._sizes}
        self._indexed = 0  # n-grams ending before this position are in _ends

    def propose(self, output_token_ids: Sequence[int], k: int) -> list[int]:
        """k tokens that followed the latest earlier occurrence of the longest matching suffix
        of prompt + output (where they run into the end, the repeat they imply continues);
        [] when no suffix of ngram_min tokens occurred before."""
        self._catch_up(output_token_ids)
        tokens = self._tokens
        length = len(tokens)
        for n in self._sizes:
            if n > length:
                continue
            end = self._ends[n].get(tuple(tokens[length - n :]))
            if end is not None:
                # Past the known end the match repeats itself: a period of length - end.
                period = length - end
                return [tokens[end + i % period] for i in range(k)]
        return []

    def _catch_up(self, output_token_ids: Sequence[int]) -> None:
        known = len(self._tokens) - self._num_prompt
        if len(output_token_ids) > known:
            self._tokens.extend(output_token_ids[known:])
        tokens = self._tokens
        # Index the n-grams that end at [_indexed, len - 1): each has a token after it.
        last = len(tokens) - 1
        for end in range(max(self._indexed, 1), last + 1):
            for n, ends in self._ends.items():
                if end >= n:
                    ends[tuple(tokens[end - n : end])] = end
        self._indexed = max(self._indexed, last + 1)
