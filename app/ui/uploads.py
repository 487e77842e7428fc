"""Uploads that leave no trace: each one removed once read (or a minute after it came, read
or not), the upload folder capped, and each visitor's share of it capped.

Gradio writes every `POST /gradio_api/upload` into its upload folder and, left alone, keeps
it for a day; a bare POST, with no analysis after it, is enough to fill the disk. The
`UploadGuard` middleware sees each upload request: it refuses one past the caps with a
message (HTTP 413), and records the files Gradio wrote, so that `Uploads` removes exactly
those (never a file this server did not take in as an upload: the bundled logs, the exports
and the rest of Gradio's cache are not its to remove).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MB = 1024 * 1024
UPLOAD_LIFETIME_S = 60  # an upload not read by then is removed anyway
FOLDER_CAP = int(os.environ.get("LLDS_UPLOAD_CAP_MB", "512")) * MB  # all visitors' uploads
VISITOR_CAP = int(os.environ.get("LLDS_UPLOAD_VISITOR_CAP_MB", "210")) * MB  # one visitor's
UPLOAD_PATH = "/gradio_api/upload"


@dataclass
class _Upload:
    path: Path
    visitor: str
    size: int
    arrived: float


class Uploads:
    """The uploads this server took in and has not removed yet."""

    def __init__(self, lifetime: float = UPLOAD_LIFETIME_S, folder_cap: int = FOLDER_CAP,
                 visitor_cap: int = VISITOR_CAP):
        self.lifetime, self.folder_cap, self.visitor_cap = lifetime, folder_cap, visitor_cap
        self._held: dict[Path, _Upload] = {}
        self._pending: dict[int, tuple[str, int]] = {}  # requests under way: visitor, bytes
        self._lock = threading.Lock()

    def held(self, visitor: str | None = None) -> int:
        """Bytes held (and being uploaded), in all or by one visitor."""
        with self._lock:
            return self._held_bytes(visitor)

    def _held_bytes(self, visitor: str | None) -> int:
        files = sum(u.size for u in self._held.values() if visitor in (None, u.visitor))
        under_way = sum(n for v, n in self._pending.values() if visitor in (None, v))
        return files + under_way

    def admit(self, request_id: int, visitor: str, length: int | None) -> str | None:
        """Why an upload of `length` bytes from `visitor` is refused now, or None (then its
        bytes count against the caps until `done`)."""
        self.sweep()
        if length is None:
            return "An upload must say its size (Content-Length)."
        with self._lock:
            would_hold = self._held_bytes(visitor) + length
            if would_hold > self.visitor_cap:
                return (f"Upload refused: your uploads would hold {_mb(would_hold)} "
                        f"on this server, past the {_mb(self.visitor_cap)} one visitor may. Each "
                        f"upload is removed once it has been read (within {self.lifetime:.0f} s): "
                        "try again then, or upload fewer or smaller logs.")
            if self._held_bytes(None) + length > self.folder_cap:
                return (f"Upload refused: the studio's upload space is full "
                        f"({_mb(self._held_bytes(None))} of {_mb(self.folder_cap)}). Uploads "
                        f"are removed once read (within {self.lifetime:.0f} s): try again in "
                        "a minute.")
            self._pending[request_id] = (visitor, length)
        return None

    def done(self, request_id: int, paths: list[str]) -> None:
        """The request ended: record the files it wrote (none when it failed)."""
        with self._lock:
            visitor, length = self._pending.pop(request_id, ("", 0))
            now = time.monotonic()
            for name in paths:
                path = Path(name)
                try:
                    size = path.stat().st_size
                except OSError:  # Gradio moves a big file into place after answering
                    size = length // max(1, len(paths))
                self._held[path] = _Upload(path, visitor, size, now)

    def is_upload(self, path: str | Path) -> bool:
        with self._lock:
            return Path(path) in self._held

    def release(self, path: str | Path) -> bool:
        """Remove an upload that has been read; False for a path that is not one."""
        with self._lock:
            upload = self._held.pop(Path(path), None)
        if upload is None:
            return False
        _remove(upload.path)
        return True

    def sweep(self, now: float | None = None) -> int:
        """Remove the uploads older than the lifetime; how many went."""
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [u for u in self._held.values() if now - u.arrived >= self.lifetime]
            for upload in old:
                del self._held[upload.path]
        for upload in old:
            _remove(upload.path)
        return len(old)


def _remove(path: Path) -> None:
    """The upload and the folder Gradio made for it, when nothing else is in it."""
    try:
        path.unlink(missing_ok=True)
        path.parent.rmdir()  # only when empty: Gradio names a folder by its file's hash
    except OSError:
        pass


def _mb(n: int) -> str:
    return f"{n / MB:.0f} MB"


UPLOADS = Uploads()  # this process's uploads (one studio a process)


class UploadGuard:
    """ASGI middleware on the studio's server: caps and records each upload request."""

    def __init__(self, app, uploads: Uploads = UPLOADS, every: float = 15.0):
        self.app, self.uploads = app, uploads
        self._sweeper = threading.Thread(target=self._sweep_forever, args=(every,),
                                         daemon=True, name="upload-sweeper")
        self._sweeper.start()

    def _sweep_forever(self, every: float) -> None:
        while True:
            time.sleep(every)
            self.uploads.sweep()

    async def __call__(self, scope, receive, send):
        if not (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"].endswith(UPLOAD_PATH)):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        # Behind a proxy (a Space), the visitor is the first address it forwarded for.
        forwarded = headers.get(b"x-forwarded-for", b"").split(b",")[0].strip().decode()
        visitor = forwarded or (scope.get("client") or ("unknown",))[0]
        request_id = id(scope)
        refusal = self.uploads.admit(request_id, visitor,
                                     int(length) if length and length.isdigit() else None)
        if refusal is not None:
            body = refusal.encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        status, chunks, recorded = 0, [], False

        async def capture(message):
            # The files are recorded before the answer's last bytes go out: a visitor who
            # reads the answer finds them held (recording after `send` raced the visitor).
            nonlocal status, recorded
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.uploads.done(request_id, _written(status, chunks))
                    recorded = True
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            if not recorded:  # the request failed before its answer ended
                self.uploads.done(request_id, [])


def _written(status: int, chunks: list[bytes]) -> list[str]:
    """The paths an upload answer lists (none for a failed one)."""
    if status != 200:
        return []
    try:
        found = json.loads(b"".join(chunks) or b"[]")
    except ValueError:
        return []
    return [p for p in found if isinstance(p, str)] if isinstance(found, list) else []
