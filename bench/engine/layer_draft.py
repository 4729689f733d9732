"""A draft model for `--speculative-method draft` cut from the target itself (issue 26): the
target GGUF's first N decoder layers, its embeddings, final norm and LM head, as a new GGUF
(self-speculation by layer skipping). No smaller model with SmolLM2's tokenizer reaches these
machines; a model's own early layers share its tokenizer and its embeddings by construction, so
this is the draft model that can be measured here. Untrained for early exit, so expect a lower
acceptance rate than a distilled draft would give.

    python -m bench.engine.layer_draft OUT.gguf --layers 8            # from the default model
    python -m bench.engine.layer_draft OUT.gguf --layers 8 --model PATH.gguf
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import gguf


def cut_layers(src: Path, out: Path, layers: int) -> int:
    """Writes `out`: `src` with decoder layers >= `layers` dropped; returns the source's count."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    total = int(reader.fields[count_key].contents())
    if not 1 <= layers < total:
        raise SystemExit(f"--layers must be in [1, {total - 1}] for this {total}-layer model")
    writer = gguf.GGUFWriter(out, arch)
    for field in reader.fields.values():
        # The writer adds the architecture itself; GGUF.* are the reader's virtual fields.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = layers if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    block = re.compile(r"blk\.(\d+)\.")
    kept = [t for t in reader.tensors
            if not (m := block.match(t.name)) or int(m.group(1)) < layers]  # fmt: skip
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--model", default="", help="the target GGUF (default: the bundled model)")
    args = p.parse_args()
    from pagedserve.core.models.resolve import resolve_model

    src = resolve_model(args.model).path
    total = cut_layers(Path(src), args.out, args.layers)
    print(f"{args.out}: layers 0-{args.layers - 1} of {total} from {src}")


if __name__ == "__main__":
    main()
