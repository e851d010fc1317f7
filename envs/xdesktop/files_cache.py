"""The files OSWorld tasks download (``download`` set-up steps, ``cloud_file`` getters), kept on this machine: the
workspace has no network, so a task's files come from here or the task is refused naming the URL.

Owns: ``FilesCache``, content-addressed by URL and checksum: ``blobs/<sha256 of the bytes>`` holds a file once,
``urls/<sha256 of the URL>`` names the blob a URL gives (its checksum, checked when the file is read back);
``put`` (a user's file, or the suite's own generated ones), ``fetch`` (a real download, only when the cache was
made with ``network=True``), ``path``/``has``; ``MissingFile`` naming the URL. The default directory is
``$BUNSHIN_FILES_CACHE`` or ``/var/lib/bunshin/files``.
Must never: hand back bytes whose checksum is not the one recorded for the URL.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

from ..errors import EnvsError

DEFAULT_DIR = "/var/lib/bunshin/files"
MAX_FILE = 1 << 30  # the largest file a download may bring
FETCH_TIMEOUT_S = 300.0


class MissingFile(EnvsError):
    """A task needs a file this machine's files cache does not hold (``url``)."""

    def __init__(self, url: str, why: str = "not in the files cache"):
        super().__init__(f"{url}: {why} (add it with `bunshin files add URL FILE`, or give --files-cache DIR)")
        self.url = url


def default_dir() -> Path:
    return Path(os.environ.get("BUNSHIN_FILES_CACHE") or DEFAULT_DIR)


def url_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


class FilesCache:
    """``directory`` (created on first write); ``network``: ``fetch`` may download what is missing."""

    def __init__(self, directory: str | Path | None = None, *, network: bool = False):
        self.dir = Path(directory) if directory is not None else default_dir()
        self.network = network

    def _link(self, url: str) -> Path:
        return self.dir / "urls" / url_key(url)

    def has(self, url: str) -> bool:
        return self._link(url).is_file()

    def put(self, url: str, data: bytes) -> Path:
        """Keep ``data`` as what ``url`` gives; returns the blob's path."""
        digest = hashlib.sha256(data).hexdigest()
        blob = self.dir / "blobs" / digest
        if not blob.is_file():
            _write_atomic(blob, data)
        link = self._link(url)
        if not link.is_file() or link.read_text().strip() != digest:
            _write_atomic(link, digest.encode())
        return blob

    def path(self, url: str) -> Path:
        """The file ``url`` gives, checked against its recorded checksum (``MissingFile`` if absent or damaged)."""
        link = self._link(url)
        try:
            digest = link.read_text().strip()
        except OSError as exc:
            raise MissingFile(url) from exc
        blob = self.dir / "blobs" / digest
        try:
            data = blob.read_bytes()
        except OSError as exc:
            raise MissingFile(url, f"its blob {blob} is gone") from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise MissingFile(url, f"its blob {blob} does not match its checksum")
        return blob

    def get(self, url: str) -> Path:
        """``path(url)``, downloading the file first when it is missing and the cache may use the network."""
        if not self.has(url) and self.network:
            self.fetch(url)
        return self.path(url)

    def fetch(self, url: str) -> Path:
        """Download ``url`` into the cache (``MissingFile`` naming it when the download fails)."""
        if not url.startswith(("https://", "http://")):
            raise MissingFile(url, "only http(s) URLs are downloaded")
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:  # noqa: S310 (http(s) only)
                data = answer.read(MAX_FILE + 1)
        except OSError as exc:
            raise MissingFile(url, f"the download failed: {exc}") from exc
        if len(data) > MAX_FILE:
            raise MissingFile(url, f"larger than {MAX_FILE >> 20} MiB")
        return self.put(url, data)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
