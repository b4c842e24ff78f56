"""Installed versions, read from metadata: what the tests expect depends on them
(the patches themselves probe the code)."""

import importlib.metadata
from typing import Optional

from packaging.version import Version


def installed(dist: str) -> Optional[Version]:
    try:
        return Version(importlib.metadata.version(dist))
    except importlib.metadata.PackageNotFoundError:
        return None
