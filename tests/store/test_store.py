import re
import time

import pytest

from eyrie.jobs.store import FileStore, NotFound, StoreError, open_store, split_uri


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return open_store(f"file://{tmp_path}/out")
    bucket = request.getfixturevalue("s3_bucket")
    s = open_store(f"{bucket}/run/one")
    s.check_writable()
    return s


@pytest.mark.integration
def test_put_get_list_range_delete(store):
    store.put("generations/shard-00001/part-00000.jsonl.gz", b"abc")
    store.put("progress.json", b"{}")
    store.put("progress.json", b'{"a": 1}')  # overwrite is atomic
    assert store.get("progress.json") == b'{"a": 1}'
    assert store.get_range("generations/shard-00001/part-00000.jsonl.gz", 1, 2) == b"bc"
    assert store.size("progress.json") == 8
    assert store.list() == ["generations/shard-00001/part-00000.jsonl.gz", "progress.json"]
    assert store.list("generations") == ["generations/shard-00001/part-00000.jsonl.gz"]
    assert store.list("nothing-here") == []
    assert store.exists("progress.json") and not store.exists("missing.json")
    with pytest.raises(NotFound):
        store.get("missing.json")
    store.delete("progress.json")
    assert not store.exists("progress.json")


@pytest.mark.integration
def test_open_streams_an_object_and_seeks_in_it(store, monkeypatch):
    body = bytes(range(256)) * 40
    store.put("prompts/p.jsonl", body)
    reads: list[tuple[int, int]] = []
    get_range = store.get_range
    monkeypatch.setattr(store, "get_range", lambda k, o, n: reads.append((o, n)) or get_range(k, o, n))
    if hasattr(store, "READ_BUFFER"):
        monkeypatch.setattr(store, "READ_BUFFER", 1000)
    with store.open("prompts/p.jsonl") as f:
        assert f.read(10) == body[:10]
        f.seek(-6, 2)
        assert f.read() == body[-6:]
        f.seek(5000)
        assert f.read(3) == body[5000:5003]
    if hasattr(store, "READ_BUFFER"):  # S3: only the ranges read, never the whole object
        assert reads and sum(n for _o, n in reads) <= 3000 and all(n <= 1000 for _o, n in reads)
    for missing in ("prompts/nope.jsonl", "prompts"):  # a folder is no object either
        with pytest.raises(NotFound):
            store.open(missing)


def test_file_store_never_lists_unfinished_writes(tmp_path):
    s = FileStore(tmp_path)
    (tmp_path / ".x.json.abc.tmp").write_bytes(b"half")
    s.put("x.json", b"whole")
    assert s.list() == ["x.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_file_store_files_are_as_readable_as_the_umask_lets_new_files_be(tmp_path, umask):
    """A teammate opens a run's report: files 0644 and folders 0755 under umask 022 (not
    mkstemp's 0600), and no more than the user's umask allows."""
    import os
    import stat

    old = os.umask(umask)
    try:
        s = FileStore(tmp_path / "out")
        s.put("hidden/shard-00000-00000.safetensors", b"x")
        s.put("report.html", b"<html>")
        s.put("report.html", b"<html></html>")  # an overwrite too
    finally:
        os.umask(old)
    for key in ("report.html", "hidden/shard-00000-00000.safetensors"):
        assert stat.S_IMODE((tmp_path / "out" / key).stat().st_mode) == 0o666 & ~umask, key
    assert stat.S_IMODE((tmp_path / "out" / "hidden").stat().st_mode) == 0o777 & ~umask


def test_bad_keys_and_schemes_are_refused(tmp_path):
    s = FileStore(tmp_path)
    with pytest.raises(StoreError):
        s.put("../escape", b"x")
    with pytest.raises(StoreError, match="unsupported store URI"):
        open_store("http://example.invalid/x")


def test_unwritable_store_is_reported(tmp_path):
    (tmp_path / "file").write_text("not a dir")
    with pytest.raises(StoreError, match="cannot write"):
        FileStore(tmp_path / "file").check_writable()


def test_wrong_s3_credentials_fail_without_echoing_them(s3_server, tmp_path):
    from eyrie.jobs.store import S3Credentials

    s = open_store("s3://nobucket/x", s3_server.endpoint, S3Credentials("wrong", "very-secret-value"))
    with pytest.raises(StoreError) as e:
        s.check_writable()
    assert "very-secret-value" not in str(e.value)


def test_split_uri():
    assert split_uri("s3://b/p/q/f.jsonl") == ("s3://b/p/q", "f.jsonl")
    assert split_uri("s3://b/f.jsonl") == ("s3://b", "f.jsonl")
    folder, name = split_uri("file:///tmp/a/b.parquet")
    assert folder == "file:///tmp/a" and name == "b.parquet"
    assert split_uri("/tmp/a#1/b?.jsonl") == ("/tmp/a#1", "b?.jsonl")  # a plain path is no URL


# ------------------------------------------------------------------------------ the S3 retry policy


def _s3_error(code: str):
    from minio.error import S3Error

    return S3Error(None, code, f"{code} message", "res", "req", "host")


def _store_with_short_retries():
    from eyrie.jobs.store import S3Store

    s = S3Store("s3://bucket/prefix", "http://127.0.0.1:9", None)
    s.RETRY_SECONDS, s.BACKOFF_BASE, s.BACKOFF_CAP = 2.0, 0.01, 0.05
    return s


def test_s3_retries_transient_failures_then_succeeds():
    import urllib3

    s = _store_with_short_retries()
    failures = [_s3_error("SlowDown"), urllib3.exceptions.ProtocolError("reset"), ConnectionRefusedError()]
    calls = []

    def fn():
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ok"

    assert s._retry("put s3://bucket/prefix/k", fn) == "ok"
    assert len(calls) == 4


def test_s3_says_it_waited_for_the_store_once_as_it_starts_and_once_as_it_ends(caplog):
    """What a pod's log keeps of an outage: one line when a call first fails, one when the store answers again (not
    one per retry); a call that never failed says nothing."""
    s = _store_with_short_retries()
    failures = [ConnectionRefusedError("connection refused")] * 3

    def fn():
        if failures:
            raise failures.pop(0)
        return "ok"

    with caplog.at_level("WARNING", logger="eyrie.jobs.store"):
        assert s._retry("put s3://bucket/prefix/k", fn) == "ok"
        assert s._retry("put s3://bucket/prefix/k2", lambda: "ok") == "ok"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("put s3://bucket/prefix/k: ConnectionRefusedError: connection refused; waiting for "
                              "the store, retrying for up to 2 s")
    assert re.fullmatch(r"put s3://bucket/prefix/k: the store answered again after [0-9.]+ s \(3 retries\)", said[1])


def test_s3_does_not_retry_what_a_retry_cannot_fix():
    s = _store_with_short_retries()
    calls = []

    def denied():
        calls.append(1)
        raise _s3_error("AccessDenied")

    with pytest.raises(StoreError, match="AccessDenied"):
        s._retry("put s3://bucket/prefix/k", denied)
    assert len(calls) == 1

    def bug():
        calls.append(1)
        raise TypeError("a programming error")

    with pytest.raises(TypeError):  # not a StoreError, and not retried
        s._retry("put s3://bucket/prefix/k", bug)
    assert len(calls) == 2


def test_s3_gives_up_after_its_retry_window_and_says_so():
    s = _store_with_short_retries()
    s.RETRY_SECONDS = 0.3

    def down():
        raise ConnectionRefusedError("connection refused")

    t0 = time.monotonic()
    with pytest.raises(StoreError, match="after 0 s of retries: ConnectionRefusedError"):
        s._retry("get s3://bucket/prefix/k", down)
    assert 0.3 <= time.monotonic() - t0 < 2.0


def test_minios_own_retries_are_off():
    s = _store_with_short_retries()
    assert s._client._http.connection_pool_kw["retries"].total is False
