"""Download folders for the app's reports (sweep and needle CSV / JSON): one fresh folder per request.

    REPORTS = Reports()            # one temporary root per process, removed at exit
    folder = REPORTS.fresh()       # a new empty folder; the oldest beyond `keep` are removed first

A public Space serves many requests: the folders are bounded (`keep`), and nothing outlives the process.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path


class Reports:
    """A temporary root of per-request folders, the newest `keep` of which are kept."""

    def __init__(self, keep: int = 16, prefix: str = "codeckv-reports-") -> None:
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)

    def fresh(self) -> Path:
        """A new empty folder for one request's downloads; older ones beyond `keep` are removed."""
        folders = sorted(self.root.iterdir(), key=lambda p: p.stat().st_mtime)
        for old in folders[: max(0, len(folders) - self.keep + 1)]:
            shutil.rmtree(old, ignore_errors=True)
        folder = self.root / uuid.uuid4().hex
        folder.mkdir()
        return folder
