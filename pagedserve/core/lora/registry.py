"""The loaded adapters: names, slots in the layers' stacks, and who uses them.

    registry = LoraRegistry(targets, base, max_loras=4, max_rank=16)
    request = registry.load("sql", "/adapters/sql")     read (a PEFT folder or a GGUF LoRA
                                                        file), check, write into a free slot
    slot = registry.acquire(request)                    a sequence starts using it
    registry.release(slot)                              ... and is done
    registry.unload("sql")                              new requests no longer find it; its slot
                                                        is cleared once no sequence uses it

Every adapter is checked whole before any weight is written: rank <= max_rank, each module one
the model has (with the shapes it has), so a refused adapter leaves the others untouched.

Under tensor parallelism each target is a rank's share of a layer (LoraTarget.shard): the
adapter is checked against the whole model's shapes, each rank writes its cut (lora/parallel.py),
and rank 0's registry sends every write and clear to the other ranks first (`mirror`: the
executor's TensorParallel), so every rank's slots hold the same adapters.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pagedserve.core.config import LoRAConfig
from pagedserve.core.lora.gguf import LoraBase, read_gguf_lora
from pagedserve.core.lora.parallel import LoraShard
from pagedserve.core.lora.peft import AdapterWeights, read_peft
from pagedserve.core.lora.weights import LoraWeights
from pagedserve.core.lora_request import LoRAError, LoRANotFoundError, LoRARequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraTarget:
    """Where one (layer, module) of an adapter goes: a part of a layer's stacks."""

    weights: LoraWeights
    part: int
    shard: LoraShard | None = None
    """This rank's share under tensor parallelism (None: the whole layer)."""

    def whole_shape(self) -> tuple[int, int]:
        """(in, out) of the whole model's projection (an adapter's A [r, in], B [out, r])."""
        shape = self.weights.in_features, self.weights.parts[self.part]
        return shape if self.shard is None else self.shard.whole(*shape)


class LoraMirror(Protocol):
    """Where rank 0's writes and clears go too: the other tensor-parallel ranks."""

    def set_lora(self, slot: int, adapter: AdapterWeights, num_slots: int, max_rank: int) -> None:
        """`adapter` into `slot` of stacks of num_slots slots of rank <= max_rank."""
        ...

    def clear_lora(self, slot: int) -> None: ...


def write_adapter(
    targets: dict[tuple[int, str], LoraTarget], slot: int, adapter: AdapterWeights
) -> None:
    """The (checked) adapter's weights into `slot` of each target, this rank's cut of each."""
    for key, (a, b, scaling) in adapter.modules.items():
        target = targets[key]
        if target.shard is not None:
            a, b = target.shard.cut(a, b)
        target.weights.set_slot(slot, target.part, a, b, scaling)


def clear_adapter(targets: dict[tuple[int, str], LoraTarget], slot: int) -> None:
    """Zeros in `slot` of every stack (a slot's zeros add nothing)."""
    for weights in stacks(targets):
        weights.clear_slot(slot)


def stacks(targets: dict[tuple[int, str], LoraTarget]) -> list[LoraWeights]:
    """The layers' stacks the targets write into, each once (a fused layer's parts share one)."""
    return list({id(t.weights): t.weights for t in targets.values()}.values())


class LoraRegistry:
    def __init__(
        self,
        targets: dict[tuple[int, str], LoraTarget],
        base: LoraBase,
        *,
        max_loras: int,
        max_rank: int,
        mirror: LoraMirror | None = None,
    ) -> None:
        self.targets, self.base, self.max_loras, self.max_rank = targets, base, max_loras, max_rank
        self.mirror = mirror
        self._free = list(range(max_loras - 1, -1, -1))  # slot 0 handed out first
        self._loaded: dict[str, LoRARequest] = {}
        self._snapshot: tuple[LoRARequest, ...] = ()  # read by other threads: swapped whole
        self._slot: dict[int, int] = {}  # lora_int_id -> slot (loaded, or retired)
        self._users: Counter[int] = Counter()  # slot -> live sequences
        self._retired: dict[int, int] = {}  # slot -> id of an unloaded adapter still in use
        self._next_id = 1

    @classmethod
    def start(
        cls,
        config: LoRAConfig,
        targets: dict[tuple[int, str], LoraTarget],
        base: LoraBase,
        mirror: LoraMirror | None = None,
    ) -> LoraRegistry:
        """The registry over the model's adapter stacks, with --lora-modules loaded (on every
        rank, through `mirror`, under tensor parallelism)."""
        registry = cls(targets, base, max_loras=config.max_loras, max_rank=config.max_lora_rank,
                       mirror=mirror)  # fmt: skip
        for name, path in config.lora_modules:
            registry.load(name, path)
        logger.info("LoRA: %d adapter slots of rank <= %d, %.1f MiB of adapter weights",
                    config.max_loras, config.max_lora_rank, registry.nbytes() / 2**20)  # fmt: skip
        return registry

    def nbytes(self) -> int:
        """What the adapter stacks take (every slot, loaded or not)."""
        return sum(w.a.nbytes + w.b.nbytes for w in stacks(self.targets))

    @property
    def loaded(self) -> list[LoRARequest]:
        return list(self._snapshot)

    def get(self, name: str) -> LoRARequest:
        request = self._loaded.get(name)
        if request is None:
            raise LoRANotFoundError(f"The model `{name}` does not exist.")
        return request

    def load(self, name: str, path: str) -> LoRARequest:
        """Read the adapter at `path` and give it a slot under `name`; LoRAError when it cannot
        be loaded (nothing changes then)."""
        if not name:
            raise LoRAError("lora_name must not be empty")
        if name in self._loaded:
            raise LoRAError(f"an adapter named {name!r} is already loaded; unload it first")
        if not self._free:
            raise LoRAError(f"all {self.max_loras} adapter slots (--max-loras) are in use; "
                            "unload an adapter first")  # fmt: skip
        adapter = read_adapter(path, self.base)
        self.check(adapter)
        slot = self._free[-1]
        if self.mirror is not None:
            self.mirror.set_lora(slot, adapter, self.max_loras, self.max_rank)
        write_adapter(self.targets, slot, adapter)
        self._free.pop()
        request = LoRARequest(name, self._next_id, str(path))
        self._next_id += 1
        self._loaded[name] = request
        self._snapshot = tuple(self._loaded.values())
        self._slot[request.lora_int_id] = slot
        logger.info("LoRA adapter %r loaded from %s (rank %d, %s) into slot %d", name, path,
                    adapter.rank, ", ".join(sorted(adapter.target_modules)), slot)  # fmt: skip
        return request

    def check(self, adapter: AdapterWeights) -> None:
        if adapter.rank > self.max_rank:
            raise LoRAError(f"adapter rank {adapter.rank} exceeds --max-lora-rank {self.max_rank}")
        for (layer, module), (a, b, _) in adapter.modules.items():
            target = self.targets.get((layer, module))
            if target is None:
                raise LoRAError(f"target module {module!r} of layer {layer}: the model has no "
                                "such projection that takes adapters")  # fmt: skip
            want_in, want_out = target.whole_shape()
            if a.shape[1] != want_in or b.shape[0] != want_out:
                raise LoRAError(f"layer {layer} {module}: the adapter is [{a.shape[1]} -> "
                                f"{b.shape[0]}], the model's projection [{want_in} -> "
                                f"{want_out}]")  # fmt: skip

    def unload(self, name: str) -> None:
        """Forget `name` (LoRANotFoundError if unknown); its slot is cleared and reused once
        the sequences still running with it are done."""
        request = self.get(name)
        del self._loaded[name]
        self._snapshot = tuple(self._loaded.values())
        slot = self._slot[request.lora_int_id]
        if self._users[slot]:
            self._retired[slot] = request.lora_int_id
        else:
            self._free_slot(slot, request.lora_int_id)
        logger.info("LoRA adapter %r unloaded", name)

    def acquire(self, request: LoRARequest) -> int:
        """The slot of an adapter for a new sequence: loaded, or unloaded while sequences still
        run with it (a request's later outputs); LoRANotFoundError otherwise."""
        slot = self._slot.get(request.lora_int_id)
        if slot is None:
            raise LoRANotFoundError(f"The model `{request.lora_name}` does not exist.")
        self._users[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        self._users[slot] -= 1
        if self._users[slot] <= 0:
            del self._users[slot]
            if slot in self._retired:
                self._free_slot(slot, self._retired.pop(slot))

    def _free_slot(self, slot: int, lora_int_id: int) -> None:
        del self._slot[lora_int_id]
        if self.mirror is not None:
            self.mirror.clear_lora(slot)
        clear_adapter(self.targets, slot)
        self._free.append(slot)


def read_adapter(path: str, base: LoraBase) -> AdapterWeights:
    """The adapter at `path`: a PEFT folder, or a `.gguf` file from llama.cpp's converter."""
    where = Path(path)
    if where.is_dir():
        return read_peft(where)
    if where.suffix.lower() == ".gguf":
        return read_gguf_lora(where, base)
    raise LoRAError(f"lora_path {path!r} is neither a folder (a PEFT adapter's) nor a .gguf file")
