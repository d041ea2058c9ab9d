"""Convert a DFlash / DFlash2 drafter checkpoint into a GGUF that llama.cpp loads as arch ``dflash``.

``pyllamaspec convert DRAFTER_DIR --target TARGET -o OUT.gguf [--outtype bf16|f16|f32|q8_0]``

The drafter directory is a Hugging Face checkpoint as z-lab publishes it: ``config.json`` with
``architectures`` ``["DFlashDraftModel"]`` or ``["DFlash2DraftModel"]`` and a ``dflash_config``
dict, plus safetensors weights (one file, or shards with ``model.safetensors.index.json``). Such
checkpoints usually carry neither token embeddings nor an LM head: llama.cpp then borrows the
target's at run time.

The metadata keys and tensor names are the ones upstream llama.cpp's own converter
(``conversion/qwen.py``, class ``DFlashModel``) writes, so the output is interchangeable with an
upstream conversion; on top of those we record provenance under ``general.source.*`` and
``pyllamaspec.*``. The tokenizer (every ``tokenizer.*`` key) is copied from the target GGUF; a target given
as a Hugging Face model directory has its sizes read from config.json and its tokenizer rebuilt from
tokenizer.json (``pyllamaspec.tools.hftarget``).

Everything that can be checked is checked before the first byte is written: the config, the
drafter/target pairing (hidden size, vocab, target layer ids, mask token: the verdict of
``pyllamaspec.ggufinfo.pairing`` on the GGUF about to be written) and the complete tensor inventory with
shapes derived from the config. The output is written to a temporary file in the
output directory, fsync'ed and renamed into place; on any failure the temporary file is removed.

Pure numpy: no PyTorch, and pickle checkpoints (``*.bin``, ``*.pt``, ``*.pth``) are refused.

Modules: config (config.json), checkpoint (safetensors), target (the target and the pairing verdict),
plan (expected tensors, their GGUF names, types and encoding), write (metadata and tensors).
"""

from __future__ import annotations

import os
from pathlib import Path

from ...atomicfile import atomic_output
from ...errors import ConversionError
from .checkpoint import inventory
from .config import parse_config
from .plan import nbytes_of, plan_tensors, qtype_for
from .target import ARCH, check_pairing, read_target, target_fingerprint, target_fingerprint_of
from .write import ProgressFn, input_paths, provenance, write_gguf

__all__ = ["ARCH", "OUTTYPES", "convert_dflash", "target_fingerprint", "target_fingerprint_of"]

OUTTYPES = ("bf16", "f16", "f32", "q8_0")


def convert_dflash(
    drafter_dir: str | os.PathLike[str],
    target: str | os.PathLike[str],
    out: str | os.PathLike[str],
    outtype: str = "bf16",
    *,
    force: bool = False,
    source_repo: str | None = None,
    source_revision: str | None = None,
    name: str | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """Convert a DFlash / DFlash2 drafter checkpoint directory into a ``dflash`` GGUF at ``out``.

    ``target`` is the target model's GGUF or Hugging Face directory (tokenizer and pairing come from it).
    Raises :class:`ConversionError` for anything wrong with the checkpoint or the output path and
    :class:`PairingError` when the drafter does not fit the target; in both cases nothing is
    written. Returns the output path.
    """
    if outtype not in OUTTYPES:
        raise ConversionError(f"outtype {outtype!r} is not one of {', '.join(OUTTYPES)}")
    drafter_dir = Path(drafter_dir)
    target = Path(target)
    out = Path(out)
    if not drafter_dir.is_dir():
        raise ConversionError(f"drafter directory {str(drafter_dir)!r} does not exist or is not a directory")

    # --- everything that can be checked, before writing anything ---
    spec = parse_config(drafter_dir)
    refs, files = inventory(drafter_dir)
    tgt = read_target(target)
    check_pairing(spec, tgt)
    planned = plan_tensors(spec, refs)

    if out.is_dir():
        raise ConversionError(f"output {str(out)!r} is a directory; pass a file name (-o OUT.gguf)")
    inputs = input_paths(drafter_dir, files, target)
    if out.resolve() in inputs or (out.exists() and any(os.path.exists(p) and os.path.samefile(out, p) for p in inputs)):
        raise ConversionError(f"output {str(out)!r} is one of the inputs; refusing to overwrite it")
    if out.exists() and not force:
        raise ConversionError(f"output {str(out)!r} already exists; pass --force to overwrite it")

    repo, revision = provenance(drafter_dir, spec, source_repo, source_revision)
    if name is None:
        name = repo.split("/")[-1] if repo else drafter_dir.resolve().name

    plan = []
    for p, ref in planned:
        qtype = qtype_for(p.gguf, p.shape, outtype)
        plan.append((p, ref, qtype, nbytes_of(p.shape, qtype)))

    # --- write to a temp file next to the output, then rename ---
    with atomic_output(out, force=force, error=ConversionError) as tmp:
        write_gguf(tmp, spec, tgt, outtype, name, repo, revision, plan, progress)
    if progress is not None:
        progress(len(plan), len(plan), "")
    return out
