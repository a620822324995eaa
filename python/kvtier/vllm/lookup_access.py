"""Where the lookup channel lives and who may use it (the channel: python/kvtier/vllm/lookup.py).

- The directory: ``$XDG_RUNTIME_DIR/kvtier`` when ``XDG_RUNTIME_DIR`` is a directory of this uid
  with mode 0700, else ``/tmp/kvtier-<uid>``; it must be a directory (not a link) owned by this
  uid with mode 0700, or nothing is served from it.
- In it, per vLLM instance and rank, a socket (0600) and a secret file (0600, exactly
  SECRET_BYTES random bytes) named after a digest of the instance name.
- A client proves it read the secret by answering the server's nonce with auth_mac().
- peer_uid() reads a connected Unix socket's peer credentials (SO_PEERCRED).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
from typing import List, Optional, Tuple

from kvtier.vllm import lookup_wire as wire

SECRET_BYTES = 32
_PEERCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


class LookupChannelError(RuntimeError):
    """The channel cannot be set up: its directory is not private, or another server already
    listens under the same name. The message says what to do."""


def _private_problem(path: str, st: os.stat_result) -> Optional[str]:
    uid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory" + (" (a symbolic link)" if stat.S_ISLNK(st.st_mode) else "")
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not {uid}"
    if stat.S_IMODE(st.st_mode) != 0o700:
        return f"mode {stat.S_IMODE(st.st_mode):04o}, not 0700"
    return None


def channel_dir() -> str:
    """The directory of this uid's lookup sockets (not created, not checked)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        try:
            if _private_problem(xdg, os.lstat(xdg)) is None:
                return os.path.join(xdg, "kvtier")
        except OSError:
            pass
    return f"/tmp/kvtier-{os.geteuid()}"


def private_dir(create: bool) -> str:
    """channel_dir(), created with mode 0700 when `create` and missing, and checked: a directory
    (not a link) owned by this uid with mode 0700. Raises LookupChannelError otherwise."""
    path = channel_dir()
    if create:
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # whatever the umask took away
        except FileExistsError:
            pass
        except OSError as e:
            raise LookupChannelError(f"kvtier lookup channel: cannot create {path}: {e}") from e
    try:
        st = os.lstat(path)
    except OSError as e:
        raise LookupChannelError(f"kvtier lookup channel: {path}: {e.strerror}") from e
    problem = _private_problem(path, st)
    if problem is not None:
        raise LookupChannelError(
            f"kvtier lookup channel: {path} is not a private directory ({problem}); it must be "
            f"a directory owned by uid {os.geteuid()} with mode 0700. If nothing else uses it, "
            f"remove it (rm -r {path}) and kvtier creates it, or chmod 700 it if it is yours; "
            f"or set XDG_RUNTIME_DIR to a private directory (mode 0700) of this user.")
    return path


def channel_paths(instance: str, rank: int, directory: str) -> Tuple[str, str]:
    """(socket path, secret path) of rank `rank`'s lookup server for vLLM instance `instance`."""
    digest = hashlib.sha256(instance.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    base = os.path.join(directory, f"lookup-{digest}-{rank}")
    return base + ".sock", base + ".secret"


def auth_mac(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, wire.AUTH_CONTEXT + nonce, hashlib.sha256).digest()


def peer_uid(sock: socket.socket) -> Tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket."""
    pid, uid, _ = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid


def read_secret(path: str) -> bytes:
    """The secret in `path`: a regular file (not a link) of this uid, mode 0600 or stricter,
    of exactly SECRET_BYTES bytes. Raises OSError or LookupChannelError."""
    # O_NONBLOCK: a FIFO in its place must not hang the client in open().
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or st.st_mode & 0o077 or st.st_size != SECRET_BYTES):
            raise LookupChannelError(
                f"{path} is not a {SECRET_BYTES}-byte private file of uid {os.geteuid()}")
        data = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != SECRET_BYTES:
        raise LookupChannelError(f"{path} changed while it was read")
    return data


def write_secret(path: str, secret: bytes) -> Tuple[int, int]:
    """Writes `secret` to `path` (mode 0600) atomically; returns its (st_dev, st_ino)."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            if os.write(fd, secret) != len(secret):
                raise OSError(f"{tmp}: short write")
            st = os.fstat(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return st.st_dev, st.st_ino


def remove_files(files: List[Tuple[str, int, int]]) -> None:
    """Unlinks each (path, st_dev, st_ino) that is still the file this server made."""
    for path, dev, ino in files:
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == (dev, ino):
                os.unlink(path)
        except OSError:
            pass
