"""The deployment's shared secret, read from its file (``shared_secret_file``).

Deployments without certificates authenticate replication peers with one secret
every process holds (see :mod:`streamrep.replication.handshake`). It lives in a
file only its owner may read, like an ssh key; this module reads and checks it,
without importing the replication machinery, so the configuration loader can
check the file too.
"""

from __future__ import annotations

import os
import stat

from streamrep.errors import StreamrepError

__all__ = ["MIN_SECRET_BYTES", "SecretFileError", "read_secret_file"]

#: The shortest secret accepted: shorter ones could be guessed offline from one
#: recorded handshake.
MIN_SECRET_BYTES = 16
_MAX_SECRET_BYTES = 65536
_GENERATE = "python -c 'import secrets; print(secrets.token_hex(32))' > FILE; chmod 600 FILE"


class SecretFileError(StreamrepError):
    """A secret file that cannot be used: one line naming the key, the file and a fix."""


def read_secret_file(path: str, key: str = "shared_secret_file") -> bytes:
    """The shared secret in *path* (surrounding whitespace stripped).

    Refused, with :class:`SecretFileError`: a missing or unreadable file, one that
    other users may read, and a secret shorter than :data:`MIN_SECRET_BYTES`.
    *key* names the setting in the error (``shared_secret_file``, a flag).
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SecretFileError(f"{key}: {path} does not exist; create it with {_GENERATE}") from None
    except OSError as exc:
        raise SecretFileError(f"{key}: cannot read {path} ({exc.strerror}); "
                              "check the path and its permissions") from None
    if not stat.S_ISREG(info.st_mode):
        raise SecretFileError(f"{key}: {path} is not a regular file; give the file holding "
                              "the secret")
    if info.st_mode & 0o077:
        raise SecretFileError(f"{key}: {path} has mode {stat.S_IMODE(info.st_mode):04o}, so "
                              f"other users may read the secret; chmod 600 {path}")
    try:
        with open(path, "rb") as fh:
            secret = fh.read(_MAX_SECRET_BYTES + 1).strip()
    except OSError as exc:
        raise SecretFileError(f"{key}: cannot read {path} ({exc.strerror}); "
                              "check its permissions") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretFileError(f"{key}: {path} holds {len(secret)} bytes, fewer than "
                              f"{MIN_SECRET_BYTES}; write a long random secret: {_GENERATE}")
    if len(secret) > _MAX_SECRET_BYTES:
        raise SecretFileError(f"{key}: {path} is longer than 64 KiB; 32 random bytes are "
                              f"enough: {_GENERATE}")
    return secret
