"""One framing for every boundary inside the jail: a message is its length (4 bytes, native order) and its bytes,
with descriptors attached where a socket carries them. The program's process and its judge exchange JSON this way
(`send` / `Channel`), the fork server hands a judge its jobs this way (`send_message` + `recv_message`), and the fork
server talks to its templates with fixed-size headers on the same sockets (template.py). Standard library only (it
runs inside the jail); `_socket` is the C half of `socket` (the Python half brings enums and `selectors`, which every
forked process would carry)."""

from __future__ import annotations

import _socket
import json
import os
import struct

LEN = struct.Struct("=I")

# one JSON form for every message (an encoder made once: json.dumps with options makes one per call)
dumps = json.JSONEncoder(separators=(",", ":")).encode


def frame(data: bytes) -> bytes:
    return LEN.pack(len(data)) + data


def send(fd: int, data: bytes) -> None:
    """One message on descriptor `fd` (a pipe or a stream socket), however many writes it takes."""
    data = frame(data)
    while data:
        data = data[os.write(fd, data):]


class Channel:
    """The receiving end of one connection's messages: one read takes a whole message in the usual case; bytes a
    read brought past the message stay here for this connection's next one (never for another connection's: each
    has its own Channel)."""

    def __init__(self, fd: int):
        self.fd, self.rest = fd, b""

    def recv(self, most: int) -> bytes | None:
        """The next message (None when the other end closed first); ValueError past `most` bytes."""
        buf, self.rest = self.rest, b""
        while len(buf) < LEN.size:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            buf += chunk
        n = LEN.unpack_from(buf)[0]
        if n > most:
            raise ValueError(f"a message of {n} bytes (most {most})")
        end = LEN.size + n
        if len(buf) < end:
            chunks, got = [buf], len(buf)
            while got < end:
                chunk = os.read(self.fd, min(end - got, 1 << 20))
                if not chunk:
                    return None
                chunks.append(chunk)
                got += len(chunk)
            buf = b"".join(chunks)
        self.rest = buf[end:]
        return buf[LEN.size:end]


def socketpair():
    """A connected pair of Unix stream sockets (`_socket.socket` objects)."""
    return _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)


def send_message(sock, data: bytes, fds=()) -> None:
    """`data` (with `fds` attached) on a stream socket: one sendmsg in the usual case, the rest of a long message
    as the socket takes it."""
    nosig = _socket.MSG_NOSIGNAL  # a peer that is gone is an OSError (EPIPE) here, never a SIGPIPE that ends us
    if fds:
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))],
                            nosig)
    else:
        sent = sock.send(data, nosig)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:], nosig)


def recv_fds(sock, size: int, most: int) -> tuple[bytes, list[int]]:
    """Up to `size` bytes from a stream socket, and the descriptors (up to `most`) sent with them."""
    data, ancillary, _, _ = sock.recvmsg(size, _socket.CMSG_SPACE(most * 4))
    fds: list[int] = []
    for level, kind, raw in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(raw) // 4}i", raw[:len(raw) - len(raw) % 4])
    return data, fds


def recv_message(sock, most_fds: int) -> tuple[bytes, list[int]] | None:
    """A framed message sent with `send_message(sock, frame(data), fds)` and its descriptors; None at the end."""
    head, fds = recv_fds(sock, LEN.size, most_fds)
    if len(head) < LEN.size:
        return None
    n = LEN.unpack(head)[0]
    data = sock.recv(n, _socket.MSG_WAITALL) if n else b""
    return (data, fds) if len(data) == n else None
