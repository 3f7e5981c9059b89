"""Weights sent to the vLLM server over HTTP, for a server that cannot see the trainer's sync directory (another
host, another mount namespace). Routes, answered by in_vllm/routes.py's middleware:

- `POST /grpo/sees {"path": p, "nonce": n}` -> `{"sees": bool, "why": str}`: whether the file `p` exists here and
  holds `n` (the trainer wrote it into its sync directory: if this server reads it, it reads the trainer's files).
- `PUT /grpo/files/<dir>/<file>` (the body streamed; header `X-GRPO-SHA256`: the file's sha256) -> `{"path":
  "<this server's copy of <dir>>", "bytes": n}`: written into this server's own upload directory (storage.SyncDir:
  `GRPO_UPLOAD_DIR`, else /dev/shm or the temp dir; removed when the server ends; left by a killed one, removed by
  the next), replacing the file of that name (removed first: one copy at a time), under a temporary name of its
  own (two sends of one file never write the same one) renamed into place once the checksum matched. A mismatch is
  refused (HTTP 422: the trainer sends it again) and nothing of it is kept; nor of a send cut short (the
  connection dropped).
- `DELETE /grpo/files/<dir>` -> `{"removed": bool}`: the trainer retired that version.

`<dir>` and `<file>` are single path components (no `/`, no `..`, no leading dot): nothing outside the upload
directory can be named.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import secrets
import shutil
from pathlib import Path

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from grpo_plugin.config.storage import CORRUPT_UPLOAD_STATUS, SEES_PREFIX, SyncDir

PREFIX = "/grpo/files/"
CHUNK = 8 << 20  # bytes hashed and written at a time, off the server's event loop
SEES_NAME = re.compile(re.escape(SEES_PREFIX) + "[0-9a-f]{32}")  # the check file's name (server/files.py writes it)
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$")
_STORE: dict[str, SyncDir] = {}


def _root() -> Path:
    if "dir" not in _STORE:
        _STORE["dir"] = SyncDir("upload", os.environ.get("GRPO_UPLOAD_DIR") or None)
        atexit.register(_STORE["dir"].close)
    return _STORE["dir"].path


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def sees(request: Request) -> JSONResponse:
    try:
        body = await request.json()
        path, nonce = Path(str(body["path"])), str(body["nonce"])
    except Exception as exc:  # noqa: BLE001 - any malformed body is the client's error
        return _error(400, f"/grpo/sees expects {{'path': str, 'nonce': str}}: {exc}")
    if not SEES_NAME.fullmatch(path.name):  # only the trainer's nonce files: no oracle on other files' contents
        return _error(400, f"/grpo/sees: {path.name!r} is not a sync-directory check file")
    try:
        if not path.is_file():
            return JSONResponse({"sees": False, "why": f"{path} does not exist on this server's host"})
        found = path.read_text()[:256]
    except OSError as exc:
        return JSONResponse({"sees": False, "why": f"{path}: {exc.strerror or exc}"})
    if found != nonce:
        return JSONResponse({"sees": False, "why": f"{path} exists here but holds another file (not the trainer's)"})
    return JSONResponse({"sees": True, "why": ""})


def _target(rest: str, parts: int) -> list[str] | None:
    names = rest.split("/")
    return names if len(names) == parts and all(_COMPONENT.match(n) for n in names) else None


async def put_file(request: Request, rest: str) -> JSONResponse:
    names = _target(rest, 2)
    if names is None:
        return _error(400, f"PUT {PREFIX}<dir>/<file>: {rest!r} is not two plain names")
    expected = request.headers.get("x-grpo-sha256", "").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        return _error(400, "PUT /grpo/files: header X-GRPO-SHA256 (the file's sha256, hex) missing or malformed")
    folder = _root() / names[0]
    folder.mkdir(exist_ok=True)
    final, part = folder / names[1], folder / f".{names[1]}.{secrets.token_hex(4)}.part"
    final.unlink(missing_ok=True)  # the version it replaces goes first: one copy at a time here too
    digest, got = hashlib.sha256(), [0]
    try:
        await _receive(request, part, digest, got)
    except OSError as exc:
        part.unlink(missing_ok=True)
        return _error(507, f"writing {final} on the server failed after {got[0]} bytes: {exc}")
    except BaseException:  # cut short (the client gone: the link dropped): nothing of it kept
        part.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != expected:
        part.unlink(missing_ok=True)
        return _error(CORRUPT_UPLOAD_STATUS, f"{names[0]}/{names[1]}: {got[0]} bytes arrived with sha256 "
                                             f"{digest.hexdigest()}, the trainer sent {expected}: nothing kept")
    os.replace(part, final)
    return JSONResponse({"path": str(folder), "bytes": got[0]})


async def _receive(request: Request, part: Path, digest, got: list[int]) -> None:
    """The request's body into `part`, hashed into `digest` on the way; `got[0]`: the bytes received so far."""
    buf = bytearray()

    def flush(fh, data: bytes) -> None:  # in a worker thread: hashing and writing release the GIL
        digest.update(data)
        fh.write(data)

    with part.open("wb") as fh:
        async for chunk in request.stream():  # the server's read size (~64 KiB): gathered into CHUNK writes
            buf += chunk
            got[0] += len(chunk)
            if len(buf) >= CHUNK:
                data, buf = bytes(buf), bytearray()
                await anyio.to_thread.run_sync(flush, fh, data)
        if buf:
            await anyio.to_thread.run_sync(flush, fh, bytes(buf))


async def delete_dir(rest: str) -> JSONResponse:
    names = _target(rest, 1)
    if names is None:
        return _error(400, f"DELETE {PREFIX}<dir>: {rest!r} is not a plain name")
    folder = _root() / names[0]
    existed = folder.is_dir()
    shutil.rmtree(folder, ignore_errors=True)
    return JSONResponse({"removed": existed})


async def files(request: Request) -> JSONResponse:
    rest = request.url.path[len(PREFIX):]
    if request.method == "PUT":
        return await put_file(request, rest)
    if request.method == "DELETE":
        return await delete_dir(rest)
    return _error(405, f"{request.method} {request.url.path}: PUT a file or DELETE a directory")
