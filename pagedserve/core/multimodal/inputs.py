"""A request's images as the engine carries them, and the placeholder ids of their tokens.

The scheduler and the prefix cache deal in token ids only. An image's tokens are given ids
derived from the image's content hash (all >= vocab_size, so never a real token): the same image
at the same place in a later prompt gives the same ids and hits the prefix cache, a different
image of the same size gives other ids and never does. The model runner embeds the image itself
at those positions, never the ids.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

_ID_LIMIT = 2**31 - 1  # token ids are int32 in the native scheduler


@dataclass(frozen=True, eq=False)
class ImageFeatures:
    """One image after the processor: what the vision tower takes."""

    pixel_values: np.ndarray
    """float32 [num_patches, patch_dim]: the image's patches, in the tower's order."""
    grid_thw: tuple[int, int, int]
    """Patches along time, height and width (time is 1 for an image)."""
    num_tokens: int
    """Tokens the image takes in the language model's prompt."""
    content_hash: bytes
    """A digest of the decoded pixels (not the file): keys the encoder and prefix caches."""

    @property
    def nbytes(self) -> int:
        return int(self.pixel_values.nbytes)


@dataclass(frozen=True, eq=False)
class MultiModalInputs:
    """A request's images, in prompt order, and the prompt position of each one's first token."""

    images: tuple[ImageFeatures, ...]
    offsets: tuple[int, ...]

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) prompt positions of each image's tokens."""
        return [(o, o + im.num_tokens) for o, im in zip(self.offsets, self.images, strict=True)]


def content_hash(mode: str, size: tuple[int, int], pixels: bytes) -> bytes:
    """The digest an image is known by: its decoded pixels and their shape."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{mode}:{size[0]}x{size[1]}:".encode())
    digest.update(pixels)
    return digest.digest()


def placeholder_ids(image_hash: bytes, num_tokens: int, vocab_size: int) -> list[int]:
    """The ids an image's tokens take in the scheduler: in [vocab_size, 2**31 - 1), a
    function of the image's hash and the token's index in the image."""
    span = _ID_LIMIT - vocab_size
    base = int.from_bytes(image_hash[:8], "little")
    step = int.from_bytes(image_hash[8:16], "little") | 1
    return [vocab_size + (base + i * step) % span for i in range(num_tokens)]


def expand_image_tokens(
    prompt_ids: list[int], images: list[ImageFeatures], image_token_id: int, vocab_size: int
) -> tuple[list[int], MultiModalInputs]:
    """Each occurrence of `image_token_id` (one per image, in order, as the chat template
    renders them) becomes that image's placeholder ids. Raises ValueError when the counts
    differ."""
    where = [i for i, token in enumerate(prompt_ids) if token == image_token_id]
    if len(where) != len(images):
        raise ValueError(
            f"the prompt has {len(where)} image tokens for {len(images)} images "
            "(the chat template places one per image)"
        )
    out: list[int] = []
    offsets: list[int] = []
    start = 0
    for at, image in zip(where, images, strict=True):
        out += prompt_ids[start:at]
        offsets.append(len(out))
        out += placeholder_ids(image.content_hash, image.num_tokens, vocab_size)
        start = at + 1
    out += prompt_ids[start:]
    return out, MultiModalInputs(tuple(images), tuple(offsets))
