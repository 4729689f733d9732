"""Multimodal rotary positions (Qwen2-VL / Qwen2.5-VL), per prompt, in numpy.

Every token has three positions (temporal, height, width). Text tokens count on from the
previous token, the same value thrice. An image of llm grid h x w (patches / merge size)
starting at position s takes (s, s + row, s + column) for each of its tokens, row-major;
the text after it starts at s + max(h, w). Generated tokens continue from the prompt's last
position: position p of the sequence rotates by p + delta on all three, delta = (the prompt's
largest position + 1) - its length.
"""

from __future__ import annotations

import numpy as np

from pagedserve.core.multimodal.inputs import MultiModalInputs


def mrope_positions(
    num_prompt: int, inputs: MultiModalInputs, merge_size: int
) -> tuple[np.ndarray, int]:
    """(int64 [3, num_prompt] positions, delta for the positions after the prompt)."""
    out = np.empty((3, num_prompt), dtype=np.int64)
    at = 0  # next prompt index to fill
    value = 0  # next text position
    for start, image in zip(inputs.offsets, inputs.images, strict=True):
        text = start - at
        out[:, at:start] = np.arange(value, value + text)
        value += text
        t, h, w = image.grid_thw
        gh, gw = h // merge_size, w // merge_size
        rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        tpos = np.repeat(np.arange(t), gh * gw)
        end = start + t * gh * gw
        out[0, start:end] = value + tpos
        out[1, start:end] = value + np.tile(rows.reshape(-1), t)
        out[2, start:end] = value + np.tile(cols.reshape(-1), t)
        value += max(gh, gw)
        at = end
    out[:, at:] = np.arange(value, value + num_prompt - at)
    value += num_prompt - at
    delta = int(out.max()) + 1 - num_prompt if num_prompt else 0
    return out, delta
