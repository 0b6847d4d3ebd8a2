"""Where the tests find the publishers' own rows: ``../shared/published/`` beside the checkout, or the folder
``KLEAR_PUBLISHED`` names. The rows are read there and never copied into this repository (their text is the
publishers', each folder's README names its source); a test that needs them skips, saying where it looked, on a
checkout without them, so a fresh clone's suite still passes."""

import os
from pathlib import Path

import pytest

PUBLISHED = Path(os.environ.get("KLEAR_PUBLISHED") or Path(__file__).resolve().parents[2] / "shared" / "published")


def require(path: Path) -> Path:
    """``path`` (under `PUBLISHED`), or skip the test when it is not there."""
    if not path.exists():
        pytest.skip(f"published rows not found at {path} (../shared/published beside the checkout, or KLEAR_PUBLISHED)")
    return path
