"""Object store: `file://` directories and `s3://` buckets behind one small interface.

Every write is atomic: a local write goes to a temporary file that is renamed into place, and an S3
write is a single PUT, so a reader never sees half an object. Keys are '/'-separated and relative
to the store's root (the run's output URI). A large object (a prompt file) is read as a stream
(`open`, `open_uri`): from disk, or range by range from S3, never held whole.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar
from urllib.parse import urlparse

from eyrie.jobs.errors import EyrieError

T = TypeVar("T")
log = logging.getLogger(__name__)


class StoreError(EyrieError, RuntimeError):
    """The store cannot be reached or written; the message names the URI, never a credential."""


class NotFound(StoreError, KeyError):
    """The key does not exist."""


class Store(Protocol):
    uri: str

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, offset: int, length: int) -> bytes: ...
    def open(self, key: str) -> IO[bytes]: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def size(self, key: str) -> int: ...
    def url(self, key: str) -> str: ...
    def check_writable(self) -> None: ...


@dataclass(frozen=True)
class S3Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never print a secret, even by accident
        return "S3Credentials(***)"


def _clean_key(key: str) -> str:
    key = key.strip("/")
    if not key or any(part in ("", ".", "..") for part in key.split("/")):
        raise StoreError(f"invalid store key {key!r}")
    return key


def _umask() -> int:
    """The process's umask, read without changing it (Linux's /proc; elsewhere set and restored once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class FileStore:
    """A local directory. Atomic via write-to-temp + os.replace in the same directory; files get the
    mode a new file gets under the user's umask, directories likewise."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = f"file://{self.root}"
        # mkstemp creates 0600; a store's files are as readable as any file the user creates (0644
        # under the usual umask 022), so a teammate can open a run's report, manifest and samples
        self.file_mode = 0o666 & ~_umask()

    def _path(self, key: str) -> Path:
        return self.root / _clean_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), self.file_mode)
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            raise StoreError(f"cannot write {self.url(key)}: {e.strerror or e}") from None

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"{self.url(key)} does not exist") from None
        except OSError as e:
            raise StoreError(f"cannot read {self.url(key)}: {e.strerror or e}") from None

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            with self._path(key).open("rb") as f:
                f.seek(offset)
                return f.read(length)
        except FileNotFoundError:
            raise NotFound(f"{self.url(key)} does not exist") from None

    def open(self, key: str) -> IO[bytes]:
        """The file itself, opened for reading; a folder is no object (`exists` says the same)."""
        try:
            return self._path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"{self.url(key)} does not exist or is not a file") from None
        except OSError as e:
            raise StoreError(f"cannot read {self.url(key)}: {e.strerror or e}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise NotFound(f"{self.url(key)} does not exist") from None

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        if not base.exists():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # an unfinished atomic write
                out.append(str(Path(dirpath, name).relative_to(self.root)).replace(os.sep, "/"))
        return sorted(out)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def url(self, key: str) -> str:
        return f"{self.uri}/{key.strip('/')}"

    def check_writable(self) -> None:
        probe = f".eyrie-write-check-{os.getpid()}"
        self.put(probe, b"ok")
        self.delete(probe)


# S3 error codes a retry can fix; anything else (denied, bad request, a bug) fails at once.
TRANSIENT_S3_CODES = frozenset({"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
                                "OperationAborted", "XMinioServerNotInitialized"})
NOT_FOUND_S3_CODES = frozenset({"NoSuchKey", "NoSuchObject", "NoSuchBucket"})


class S3Store:
    """An S3 bucket/prefix through the minio SDK. The one retry policy: a transient failure (a 5xx
    code above, a dropped or refused connection, a timeout) is retried with jittered exponential
    backoff for up to `RETRY_SECONDS` (an S3 outage that long costs a pause, not the run); minio's
    own urllib3 retries are off so the two never stack."""

    RETRY_SECONDS = 60.0
    BACKOFF_BASE, BACKOFF_CAP = 0.25, 8.0
    READ_BUFFER = 8 << 20  # bytes per range request of a stream (`open`)

    def __init__(self, uri: str, endpoint: str | None, credentials: S3Credentials | None,
                 region: str | None = None):
        import certifi
        import urllib3
        from minio import Minio

        parsed = urlparse(uri)
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.uri = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        ep = urlparse(endpoint or "https://s3.amazonaws.com")
        if not ep.netloc:
            raise StoreError(f"output.endpoint {endpoint!r} is not a URL such as http://minio:9000")
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=10, read=120), maxsize=32, retries=False,
            cert_reqs="CERT_REQUIRED", ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where())
        self._client = Minio(
            ep.netloc,
            access_key=credentials.access_key if credentials else None,
            secret_key=credentials.secret_key if credentials else None,
            secure=ep.scheme == "https",
            region=region,
            http_client=http,
        )

    def _key(self, key: str) -> str:
        key = _clean_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        import urllib3
        from minio.error import S3Error, ServerError

        start = time.monotonic()
        deadline = start + self.RETRY_SECONDS
        for attempt in itertools.count():
            try:
                out = fn()
                if attempt:  # the writer (or reader) says it waited, and for how long: a pod's log keeps it
                    log.warning("%s: the store answered again after %.1f s (%d retries)", what,
                                time.monotonic() - start, attempt)
                return out
            except S3Error as e:
                if e.code in NOT_FOUND_S3_CODES and what.startswith("get"):
                    raise NotFound(f"{what}: {e.code}") from None
                if e.code not in TRANSIENT_S3_CODES or time.monotonic() >= deadline:
                    raise StoreError(f"{what} failed: {e.code}: {e.message}") from None
                error = f"{e.code}: {e.message}"
            except (ServerError, urllib3.exceptions.HTTPError, OSError) as e:  # a bare 5xx, the network
                if time.monotonic() >= deadline:
                    raise StoreError(f"{what} failed after {self.RETRY_SECONDS:.0f} s of retries: "
                                     f"{type(e).__name__}: {e}") from None
                error = f"{type(e).__name__}: {e}"
            if not attempt:
                log.warning("%s: %s; waiting for the store, retrying for up to %.0f s", what, error,
                            self.RETRY_SECONDS)
            step = min(self.BACKOFF_CAP, self.BACKOFF_BASE * 2 ** attempt)
            time.sleep(min(random.uniform(step / 2, step), max(0.0, deadline - time.monotonic())))
        raise AssertionError("unreachable")

    def put(self, key: str, data: bytes) -> None:
        k = self._key(key)
        self._retry(f"put {self.url(key)}", lambda: self._client.put_object(
            self.bucket, k, io.BytesIO(data), len(data)))

    def get(self, key: str) -> bytes:
        return self._read(key, 0, 0)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self._read(key, offset, length)

    def _read(self, key: str, offset: int, length: int) -> bytes:
        """length 0 reads to the end (minio's convention)."""
        k = self._key(key)

        def read() -> bytes:
            resp = self._client.get_object(self.bucket, k, offset=offset, length=length)
            try:
                return resp.read()
            finally:
                resp.close()
                resp.release_conn()

        return self._retry(f"get {self.url(key)}", read)

    def open(self, key: str) -> IO[bytes]:
        """A seekable stream fetched `READ_BUFFER` bytes at a time: a Parquet reader seeking to its footer
        and row groups, or a shard reading its slice of a JSONL file, downloads only what it reads."""
        return io.BufferedReader(_RangeReader(self, key, self.size(key)), self.READ_BUFFER)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except NotFound:
            return False

    def size(self, key: str) -> int:
        k = self._key(key)
        return self._retry(f"get (stat) {self.url(key)}", lambda: self._client.stat_object(self.bucket, k).size)

    def list(self, prefix: str = "") -> list[str]:
        p = self._key(prefix) + "/" if prefix.strip("/") else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0

        def ls() -> list[str]:
            return sorted(o.object_name[strip:] for o in self._client.list_objects(
                self.bucket, prefix=p, recursive=True) if not o.is_dir)

        try:
            return self._retry(f"get (list) {self.uri}/{prefix}", ls)
        except NotFound:
            return []

    def delete(self, key: str) -> None:
        k = self._key(key)
        self._retry(f"delete {self.url(key)}", lambda: self._client.remove_object(self.bucket, k))

    def url(self, key: str) -> str:
        return f"{self.uri}/{key.strip('/')}"

    def ensure_bucket(self) -> None:
        if not self._retry(f"check bucket s3://{self.bucket}", lambda: self._client.bucket_exists(self.bucket)):
            self._retry(f"create bucket s3://{self.bucket}", lambda: self._client.make_bucket(self.bucket))

    def check_writable(self) -> None:
        self.ensure_bucket()
        probe = f".eyrie-write-check-{os.getpid()}"
        self.put(probe, b"ok")
        self.delete(probe)


class _RangeReader(io.RawIOBase):
    """A seekable read-only stream over a stored object of `size` bytes, each read a `get_range` (buffered
    by the caller)."""

    def __init__(self, store: Store, key: str, size: int):
        self._store, self._key, self._size, self._pos = store, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._store.get_range(self._key, self._pos, n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


class PrefixedStore:
    """The part of a store under one folder, seen as a store of its own: code written for a run's
    output (the journal, parts, `records.iter_records`) works unchanged on a sub-tree of it, such as
    the audit's answers (`contract/audit.py`)."""

    def __init__(self, inner: Store, prefix: str):
        self.inner = inner
        self.prefix = _clean_key(prefix.strip("/")) + "/"
        self.uri = inner.url(self.prefix.rstrip("/"))

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(self.prefix + key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(self.prefix + key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self.inner.get_range(self.prefix + key, offset, length)

    def open(self, key: str) -> IO[bytes]:
        return self.inner.open(self.prefix + key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(self.prefix + key)

    def size(self, key: str) -> int:
        return self.inner.size(self.prefix + key)

    def list(self, prefix: str = "") -> list[str]:
        n = len(self.prefix)
        inside = (self.prefix + prefix.strip("/")).rstrip("/")
        return [k[n:] for k in self.inner.list(inside) if k.startswith(self.prefix)]

    def delete(self, key: str) -> None:
        self.inner.delete(self.prefix + key)

    def url(self, key: str) -> str:
        return self.inner.url(self.prefix + key)

    def check_writable(self) -> None:
        self.inner.check_writable()


def s3_credentials_from_env() -> S3Credentials | None:
    ak, sk = os.environ.get("EYRIE_S3_ACCESS_KEY"), os.environ.get("EYRIE_S3_SECRET_KEY")
    return S3Credentials(ak, sk) if ak and sk else None


def open_store(uri: str, endpoint: str | None = None, credentials: S3Credentials | None = None,
               region: str | None = None) -> Store:
    """Open the store at `uri`; S3 credentials default to EYRIE_S3_ACCESS_KEY/EYRIE_S3_SECRET_KEY."""
    if uri.startswith("s3://"):
        return S3Store(uri, endpoint or os.environ.get("EYRIE_S3_ENDPOINT"),
                       credentials or s3_credentials_from_env(), region)
    if uri.startswith("file://"):
        return FileStore(urlparse(uri).path)
    if "://" in uri:
        raise StoreError(f"unsupported store URI {uri!r}: use s3:// or file://")
    return FileStore(uri)


def open_output(spec) -> Store:  # spec: DatasetGenerationSpec (untyped to keep this module light)
    return open_store(spec.output.uri, spec.output.endpoint, None, spec.output.region)


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://b/p/file.jsonl` -> (`s3://b/p`, `file.jsonl`): the folder store and the key in it."""
    if uri.startswith("s3://"):
        parsed = urlparse(uri)
        path = parsed.path.strip("/")
        head, _, name = path.rpartition("/")
        return f"s3://{parsed.netloc}" + (f"/{head}" if head else ""), name
    if uri.startswith("file://"):
        path = Path(urlparse(uri).path).expanduser()
        return f"file://{path.parent.resolve()}", path.name
    path = Path(uri).expanduser()  # a plain path stays one: a '#' or '?' in it is no URL syntax
    return str(path.parent.resolve()), path.name


def read_uri(uri: str, endpoint: str | None = None) -> bytes:
    """Read one small object given its full URI (a SpecForge draft config)."""
    folder, name = split_uri(uri)
    return open_store(folder, endpoint).get(name)


def open_uri(uri: str, endpoint: str | None = None) -> IO[bytes]:
    """A seekable stream over one object given its full URI (prompt files: see `Store.open`); a URI that
    names a bucket or a folder is NotFound."""
    folder, name = split_uri(uri)
    if not name:
        raise NotFound(f"{uri} names a bucket or a folder, not an object")
    return open_store(folder, endpoint).open(name)
