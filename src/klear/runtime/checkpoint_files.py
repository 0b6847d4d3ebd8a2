"""What a checkpoint file of a run is made of, checked without loading it (nothing heavy is imported): a one-file
checkpoint is a torch zip archive, a sharded one (``trainer.strategy=fsdp2``) a directory of
``torch.distributed.checkpoint`` shards with Lightning's ``meta.pt``. `klear.run.directory` checks the checkpoint a
``--resume`` starts from with it, and `klear.config.model_path` one given as a model (`is_run_checkpoint`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

SUFFIX = ".ckpt"
"""The name a run's checkpoint ends in (``<output_dir>/checkpoints/step-N.ckpt``), a file or a directory."""


def is_run_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` names a run's checkpoint that exists: a ``.ckpt`` file, or a ``.ckpt`` directory of shards."""
    path = Path(path).expanduser()
    return path.suffix == SUFFIX and path.exists()


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be loaded, or None. A one-file checkpoint is a torch zip archive whose
    index sits at its end, so a file cut short has none, or members that end past the file; a sharded (fsdp2) one
    is a directory with torch.distributed.checkpoint's ``.metadata`` and Lightning's ``meta.pt``. The values
    themselves are not read (that would cost a full load)."""
    if path.is_dir():
        shards = list(path.glob("*.distcp"))
        for required in (path / ".metadata", path / "meta.pt"):
            if not required.is_file() or required.stat().st_size == 0:
                return f"{required.name} is missing or empty"
        if not shards:
            return "it holds no .distcp shard"
        path = path / "meta.pt"
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        return f"not a complete torch checkpoint: {error}"
    if not any(member.filename.endswith("/data.pkl") for member in members):
        return "not a torch checkpoint: no data.pkl in the archive"
    cut = [member.filename for member in members if member.header_offset + member.compress_size > size]
    return f"{cut[0]} ends past the end of the file" if cut else None
