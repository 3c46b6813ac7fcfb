"""The repository stands alone: evaluation data in data/ verified against SHA256SUMS, and no
source file reaches outside the repository."""
import shutil
import subprocess

import pytest

from golden import paths
from golden.errors import DataError


def _listed() -> list[str]:
    return sorted(paths._checksums(paths.DATA_ROOT))


def test_every_data_file_is_listed_and_verifies():
    listed = _listed()
    on_disk = sorted(str(p.relative_to(paths.DATA_ROOT)) for p in paths.DATA_ROOT.rglob("*")
                     if p.is_file() and p.name not in ("SHA256SUMS", "README.md"))
    assert listed == on_disk
    assert {"wikitext2/test.txt", "stsb/sts-dev.csv", "sst2/dev.tsv"} <= set(listed)
    assert sum(1 for name in listed if name.startswith("mmlu/test/")) == 9
    for name in listed:
        assert paths.data_file(name).stat().st_size > 0


def test_a_flipped_byte_or_missing_file_is_a_data_error(tmp_path):
    root = tmp_path / "data"
    shutil.copytree(paths.DATA_ROOT, root)
    target = root / "sst2" / "dev.tsv"
    raw = bytearray(target.read_bytes())
    raw[100] ^= 1
    target.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="does not match its checksum"):
        paths._verified(root, "sst2/dev.tsv")
    assert paths._verified(root, "stsb/sts-dev.csv").is_file()   # the others still verify
    (root / "wikitext2" / "test.txt").unlink()
    with pytest.raises(DataError, match="missing"):
        paths._verified(root, "wikitext2/test.txt")
    with pytest.raises(DataError, match="not listed"):
        paths._verified(root, "stsb/other.csv")


def test_no_tracked_file_reads_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=paths.PROJECT_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    sibling = "sh" + "ared"   # the folder beside the checkout that data came from (not spelled out here)
    patterns = (f"../{sibling}", f'"{sibling}"', "PROJECT_ROOT" + ".parent")
    offenders = []
    for name in files:
        if not name.endswith((".py", "Makefile", ".toml", ".cfg")) and not name.startswith(".ci/"):
            continue
        text = (paths.PROJECT_ROOT / name).read_text()
        if any(p in text for p in patterns):
            offenders.append(name)
    assert files and offenders == []
