"""A data set's decoded recordings are kept on disk: read back equal, never from another source
file or reader, and a cache file that is not what it should be is decoded afresh."""
from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from edgetrain.data import Recordings
from edgetrain.datacache import CACHE_ENV, cache_key, cached_recordings, to_arrays


def tiny(sessions: bool = True) -> Recordings:
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(n, 6)) for n in (5, 0, 7)]
    return Recordings(x=x, y=np.array([0, 1, 2]), subject=np.array([1, 1, 2]),
                      side=np.array([0, 1, 0]), classes=("a", "b", "c"),
                      session=np.array([1, 2, 1]) if sessions else None)


class Reader:
    """A data set reader that counts its calls."""

    def __init__(self, recs: Recordings):
        self.recs, self.calls = recs, 0

    def __call__(self) -> Recordings:
        self.calls += 1
        return self.recs


def same(a: Recordings, b: Recordings) -> bool:
    return (len(a.x) == len(b.x) and all(np.array_equal(p, q) for p, q in zip(a.x, b.x))
            and all(np.array_equal(getattr(a, k), getattr(b, k))
                    for k in ("y", "subject", "side"))
            and a.classes == b.classes and (a.session is None) == (b.session is None)
            and (a.session is None or np.array_equal(a.session, b.session)))


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    src = tmp_path / "shipped.bin"
    src.write_bytes(b"the shipped file")
    return src


@pytest.mark.parametrize("sessions", [True, False])
def test_decoded_once_then_read_back_equal(source, sessions):
    reader = Reader(tiny(sessions))
    first = cached_recordings("toy", source, reader)
    again = cached_recordings("toy", source, reader)
    assert reader.calls == 1 and same(first, reader.recs) and same(again, reader.recs)
    files = list((source.parent / "cache").glob("toy-*.npz"))
    assert len(files) == 1
    # the file holds the samples once, float64: 12 samples x 6 channels x 8 bytes
    assert to_arrays(again)["samples"].nbytes == 12 * 6 * 8


def test_a_changed_source_file_is_decoded_again_and_the_old_file_removed(source):
    reader = Reader(tiny())
    cached_recordings("toy", source, reader)
    old = list((source.parent / "cache").glob("toy-*.npz"))
    source.write_bytes(b"a new wheel's file, longer")
    cached_recordings("toy", source, reader)
    new = list((source.parent / "cache").glob("toy-*.npz"))
    assert reader.calls == 2 and len(new) == 1 and new != old


def test_a_changed_reader_changes_the_key(tmp_path, monkeypatch):
    (tmp_path / "toyreader.py").write_text("def load():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    src = tmp_path / "shipped.bin"
    src.write_bytes(b"x")
    mod = importlib.import_module("toyreader")
    before = cache_key("toy", src, mod.load)
    (tmp_path / "toyreader.py").write_text("def load():\n    return 2\n")
    assert cache_key("toy", src, mod.load) != before
    sys.modules.pop("toyreader")


def _bad_files():
    good = to_arrays(tiny())
    nan = dict(good, samples=good["samples"].copy())
    nan["samples"][3, 2] = np.nan
    yield "not a zip", None
    yield "an object array", dict(good, classes=np.array([{"a": 1}], dtype=object))
    yield "offsets past the samples", dict(good, offsets=np.array([0, 5, 5, 99]))
    yield "offsets going back", dict(good, offsets=np.array([0, 6, 5, 12]))
    yield "a label beyond the classes", dict(good, y=np.array([0, 1, 7]))
    yield "a missing array", {k: v for k, v in good.items() if k != "side"}
    yield "an extra array", dict(good, extra=np.zeros(3))
    yield "a non-finite sample", nan
    yield "three channels", dict(good, samples=good["samples"][:, :3])
    yield "float32 samples", dict(good, samples=good["samples"].astype(np.float32))


@pytest.mark.parametrize("what, arrays", list(_bad_files()), ids=[w for w, _ in _bad_files()])
def test_a_cache_file_that_is_not_what_it_should_be_is_decoded_afresh(source, what, arrays):
    reader = Reader(tiny())
    cached_recordings("toy", source, reader)
    (path,) = (source.parent / "cache").glob("toy-*.npz")
    if arrays is None:
        path.write_bytes(b"PK\x03\x04 not really")
    else:
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    got = cached_recordings("toy", source, reader)
    assert reader.calls == 2 and same(got, reader.recs)
    assert same(cached_recordings("toy", source, reader), reader.recs) and reader.calls == 2


def test_off_reads_the_source_every_time_and_writes_nothing(source, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "off")
    reader = Reader(tiny())
    cached_recordings("toy", source, reader)
    cached_recordings("toy", source, reader)
    assert reader.calls == 2 and not (source.parent / "cache").exists()


def test_a_cache_that_cannot_be_written_still_gives_the_recordings(source, monkeypatch):
    blocker = source.parent / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    reader = Reader(tiny())
    assert same(cached_recordings("toy", source, reader), reader.recs)
    assert same(cached_recordings("toy", source, reader), reader.recs) and reader.calls == 2
