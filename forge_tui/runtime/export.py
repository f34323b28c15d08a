"""``forge export WS OUT``: the promoted kernels as a self-contained folder (manifest, sources,
builds per arch, constants, checksums) that loads with torch and this package's runtime alone:
``forge_tui.runtime.apply(model, OUT)``. Loading verifies every checksum; a kernel without a
build for the machine's arch is reported and falls back to PyTorch, never fails the model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import ForgeError
from .manifest import MANIFEST_NAME, Manifest, sha256_file

CHECKSUMS = "checksums.json"


def export(kernels_folder: Path, out: Path) -> Path:
    """Copy ``kernels_folder`` (a workspace's kernels/) to ``out`` with a checksum of every file."""
    src = Path(kernels_folder)
    if not (src / MANIFEST_NAME).is_file():
        raise ForgeError(f"{src} has no promoted kernels to export")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ForgeError(f"{out} exists and is not empty")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    man = Manifest.load(src)
    files: dict[str, str] = {}
    for card in man.entries:
        folder = src / card
        if not folder.is_dir():
            raise ForgeError(f"the manifest names {card} but {folder} is missing")
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                rel = f.relative_to(src)
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest)
                files[str(rel)] = sha256_file(dest)
    man.save(tmp)
    files[MANIFEST_NAME] = sha256_file(tmp / MANIFEST_NAME)
    (tmp / CHECKSUMS).write_text(json.dumps(files, indent=1, sort_keys=True) + "\n")
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out


def verify(folder: Path) -> None:
    """Every file an export lists has its checksum; raises ForgeError naming the first that does not."""
    folder = Path(folder)
    path = folder / CHECKSUMS
    if not path.is_file():
        raise ForgeError(f"{folder} is not a forge export (no {CHECKSUMS})")
    try:
        files = json.loads(path.read_text())
    except ValueError as exc:
        raise ForgeError(f"{path} is not valid JSON: {exc}") from None
    for rel, digest in files.items():
        f = folder / rel
        if not f.is_file():
            raise ForgeError(f"the export is incomplete: {rel} is missing")
        if sha256_file(f) != digest:
            raise ForgeError(f"the export is damaged: {rel} does not match its checksum")
