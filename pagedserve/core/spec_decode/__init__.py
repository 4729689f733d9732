"""Speculative decoding: proposers (ngram, draft) and the engine's side of it (speculator).

A proposer guesses the next tokens of a decoding sequence; the scheduler plans them after the
sequence's last token as one verification chunk; the model runner samples every position of
the chunk as it would sample a decode step (spec_decode/verify.py) and keeps the drafts up to
the first one the target disagrees with, then the target's own token. The proposals are
deterministic given the sequence (one-hot proposal distributions), so "sample the target at
each position and accept while it equals the draft" is exact rejection sampling: greedy and
sampled outputs keep their distribution, seeded ones their very tokens. ngram, speculator and
verify import no torch; draft.py (a model of its own) does.
"""
