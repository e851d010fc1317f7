"""The framed-file module (envs/framing.py): round trips through every way of writing and reading a frame, and each
kind of damage refused with its typed error naming the file; the formats built on it refuse what they cannot read."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bunshin.envs import EnvsError, state_image
from bunshin.envs.framing import (
    HEADER,
    BadLength,
    BadMagic,
    Checksum,
    ChecksumMismatch,
    Format,
    FramingError,
    Oversize,
    Truncated,
    UnsupportedVersion,
)
from bunshin.envs.runtime import checkpoint_file

FORMATS = [Format("test file", b"BUNSHTST", 3, kind) for kind in Checksum]
BODY = b"hello, frame " * 8


def _ids(fmt: Format) -> str:
    return fmt.checksum.value


def _framed(tmp_path: Path, fmt: Format, body: bytes = BODY) -> Path:
    path = tmp_path / "f.bin"
    assert fmt.write_file(path, [body[:5], memoryview(body[5:])]) == len(body) + fmt.overhead
    return path


@pytest.mark.parametrize("fmt", FORMATS, ids=_ids)
def test_every_way_of_writing_reads_back(tmp_path: Path, fmt: Format) -> None:
    body = bytes(range(256)) * 1000
    path = _framed(tmp_path, fmt, body)
    raw = path.read_bytes()
    assert raw[:8] == b"BUNSHTST" and HEADER.unpack_from(raw) == (b"BUNSHTST", 3, len(body))
    assert len(raw) == HEADER.size + len(body) + fmt.checksum.size
    assert bytes(fmt.read(path)) == body
    assert b"".join(bytes(b) for b in fmt.frame([body])) == raw
    view = fmt.verify(raw, path)
    assert bytes(view) == body
    view.release()
    into = memoryview(bytearray(len(body)))
    fmt.read_into(path, into)
    assert bytes(into) == body
    with open(tmp_path / "fd.bin", "wb") as f:
        assert fmt.write_fd(f.fileno(), [body]) == len(raw)
    fd = os.open(tmp_path / "fd.bin", os.O_RDONLY)
    try:
        mapping, payload = fmt.map_fd(fd, "fd.bin")
    finally:
        os.close(fd)
    assert bytes(payload) == body
    payload.release()
    mapping.close()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@given(parts=st.lists(st.binary(max_size=300), max_size=5), kind=st.sampled_from(list(Checksum)))
def test_any_parts_round_trip(parts: list[bytes], kind: Checksum) -> None:
    fmt = Format("test file", b"BUNSHTST", 1, kind)
    data = b"".join(bytes(b) for b in fmt.frame(parts))
    view = fmt.verify(bytearray(data))
    assert bytes(view) == b"".join(parts)
    view.release()


def _flip(at: int):
    def damage(b: bytearray) -> bytearray:
        b[at] ^= 0x10
        return b
    return damage


DAMAGE = [  # name, damage, error, words of its message
    ("magic", _flip(0), BadMagic, "bad magic"),
    ("version", lambda b: b[:8] + struct.pack("<I", 9) + b[12:], UnsupportedVersion, "format version 9, this reader"),
    ("last-byte-gone", lambda b: b[:-1], Truncated, "header says"),
    ("half", lambda b: b[:len(b) // 2], Truncated, "cut at"),
    ("shorter-than-a-header", lambda b: b[:HEADER.size - 1], Truncated, "shorter than its header"),
    ("empty", lambda b: bytearray(), Truncated, "0 bytes is shorter"),
    ("trailing-bytes", lambda b: b + b"x", BadLength, "followed by 1 more"),
    ("oversize-length", lambda b: b[:12] + struct.pack("<Q", 1 << 50) + b[20:], Oversize, "more than"),
    ("length-past-the-file", lambda b: b[:12] + struct.pack("<Q", 1 << 39) + b[20:], Truncated, "cut at"),
]


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.checksum is not Checksum.NONE], ids=_ids)
def test_a_flipped_byte_is_a_checksum_mismatch(tmp_path: Path, fmt: Format) -> None:
    path = _framed(tmp_path, fmt)
    for at in (HEADER.size, HEADER.size + 7, path.stat().st_size - 1):  # in the body, and in the trailer
        raw = bytearray(path.read_bytes())
        raw[at] ^= 1
        bad = tmp_path / f"flip-{at}.bin"
        bad.write_bytes(raw)
        with pytest.raises(ChecksumMismatch, match="checksum mismatch") as info:
            fmt.read(bad)
        assert str(bad) in str(info.value) and info.value.path == str(bad)
        with pytest.raises(ChecksumMismatch):
            fmt.verify(raw, bad)


@pytest.mark.parametrize("fmt", FORMATS, ids=_ids)
@pytest.mark.parametrize(("name", "damage", "error", "words"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_each_damage_has_its_typed_error_naming_the_file(tmp_path: Path, fmt: Format, name: str, damage, error,
                                                         words: str) -> None:
    """The length cases would allocate 2^50 or 2^39 bytes if a reader trusted the header: they fail fast."""
    fmt = Format(fmt.what, fmt.magic, fmt.version, fmt.checksum, max_body=1 << 40)
    bad = tmp_path / f"{name}.bin"
    bad.write_bytes(damage(bytearray(_framed(tmp_path, fmt).read_bytes())))
    fd = os.open(bad, os.O_RDONLY)
    try:
        readers = {
            "read": lambda: fmt.read(bad),
            "read_into": lambda: fmt.read_into(bad, memoryview(bytearray(len(BODY)))),
            "map_fd": lambda: fmt.map_fd(fd, str(bad)),
            "verify": lambda: fmt.verify(bad.read_bytes(), bad),
        }
        for reader, read in readers.items():
            with pytest.raises(error, match=words) as info:
                read()
            e = info.value
            assert isinstance(e, FramingError) and isinstance(e, EnvsError) and isinstance(e, ValueError), reader
            assert str(e) == f"test file {bad}: {e.reason}" and e.path == str(bad) and e.what == "test file"
    finally:
        os.close(fd)
    if error is UnsupportedVersion:
        assert (info.value.version, info.value.known) == (9, 3)


def test_a_buffer_that_fails_is_released(tmp_path: Path) -> None:
    """A failed ``verify`` keeps no view of the buffer: a bytearray can still be resized, a mapping closed."""
    fmt = FORMATS[0]
    raw = bytearray(b"".join(bytes(b) for b in fmt.frame([b"body"])))
    raw[HEADER.size] ^= 1
    with pytest.raises(ChecksumMismatch):
        fmt.verify(raw)
    raw.extend(b"resizable: no view left")
    path = tmp_path / "bad.bin"
    path.write_bytes(raw[:-len(b"resizable: no view left")])
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ChecksumMismatch):
            fmt.map_fd(fd, str(path))  # closes its mapping (else a BufferError would have surfaced)
    finally:
        os.close(fd)


def test_read_into_checks_the_size_and_the_expected_digest(tmp_path: Path) -> None:
    fmt = Format("chunk", b"BUNSHTST", 1, Checksum.BLAKE2B_256)
    path = _framed(tmp_path, fmt)
    with pytest.raises(BadLength, match="expected 3"):
        fmt.read_into(path, memoryview(bytearray(3)))
    other = fmt.checksum.digest([memoryview(b"another body")])
    with pytest.raises(ChecksumMismatch, match=f"not the expected {other.hex()}"):
        fmt.read_into(path, memoryview(bytearray(len(BODY))), digest=other)
    fmt.read_into(path, memoryview(bytearray(len(BODY))), digest=fmt.checksum.digest([memoryview(BODY)]))


def test_writing_over_the_cap_or_with_a_wrong_digest_is_refused() -> None:
    fmt = Format("small file", b"BUNSHTST", 1, Checksum.CRC32, max_body=4)
    with pytest.raises(Oversize, match="5 bytes, more than the 4"):
        fmt.frame([b"12", b"345"])
    with pytest.raises(ValueError, match="4 bytes, got 2"):
        fmt.frame([b"1"], digest=b"xx")
    with pytest.raises(ValueError, match="8 bytes"):
        Format("x", b"SHORT", 1, Checksum.NONE)


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    fmt = FORMATS[0]
    path = _framed(tmp_path, fmt, b"old")
    stale = tmp_path / f".{path.name}.0123456789abcdef.tmp"  # a write that crashed before its rename
    stale.write_bytes(b"torn")

    def crash() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        fmt.write_file(path, [b"new"], fault=crash)
    assert bytes(fmt.read(path)) == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [stale.name, path.name]
    fmt.write_file(path, [b"new"])
    assert bytes(fmt.read(path)) == b"new" and [p.name for p in tmp_path.iterdir()] == [path.name]
    assert path.stat().st_mode & 0o777 == 0o600


# -- the formats built on it -----------------------------------------------------------------------------------
def test_a_state_image_is_a_frame_and_its_errors_are_envs_errors() -> None:
    image = b"".join(bytes(memoryview(p)) for p in state_image.dump({"a": bytearray(100_000), "b": [1, 2]}))
    assert HEADER.unpack_from(image)[:2] == (state_image.MAGIC, state_image.VERSION)
    assert state_image.load(image) == {"a": bytearray(100_000), "b": [1, 2]}
    unframed_v1 = struct.pack("<8sIQQ", state_image.MAGIC, 2, 3, 4) + b"abc" + b"defg"  # the old layout
    for bad, cause in [(image[:-1], Truncated), (b"NOTANIMG" + image[8:], BadMagic), (unframed_v1, BadLength),
                       (image[:8] + struct.pack("<I", 1) + image[12:], UnsupportedVersion)]:
        with pytest.raises(state_image.StateImageError) as info:
            state_image.load(bad)
        assert isinstance(info.value, EnvsError) and isinstance(info.value.__cause__, cause)
    # a body whose table is wrong: a valid frame around it
    for body, words in [(struct.pack("<I", 0), "0 parts"), (struct.pack("<IQ", 1, 5) + b"abc", "parts of 5 bytes")]:
        frame = b"".join(bytes(b) for b in state_image.FORMAT.frame([body]))
        with pytest.raises(state_image.StateImageError, match=words):
            state_image.load(frame)


def test_a_state_image_is_verified_by_the_checkpoint_it_travels_in(tmp_path: Path) -> None:
    """The state image's frame has no checksum of its own: the checkpoint file around it has (a flipped byte in
    the image is refused before ``load`` sees it)."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        checkpoint_file.write(fd, "c.bin", state_image.dump({"heap": bytearray(b"x" * 100_000)}))
        raw = bytearray((tmp_path / "c.bin").read_bytes())
        raw[len(raw) // 2] ^= 1
        (tmp_path / "c.bin").write_bytes(raw)
        with pytest.raises(checkpoint_file.CorruptCheckpoint, match="checksum mismatch") as info:
            checkpoint_file.map_verified(fd, "c.bin")
        assert isinstance(info.value.__cause__, ChecksumMismatch) and "c.bin" in str(info.value)
    finally:
        os.close(fd)


def test_a_format_1_spec_selector_file_is_refused_by_name(tmp_path: Path) -> None:
    from bunshin.engine.speculation import selector

    head = msgspec.json.encode({"format": 1, "namespace": "ns", "examples": 0, "examples_bytes": 0})
    old = selector.MAGIC + struct.pack("<I", len(head)) + head
    (tmp_path / "old.bin").write_bytes(old + struct.pack("<I", zlib.crc32(old)))
    with pytest.raises(selector.BadFile, match=f"spec selector file {tmp_path / 'old.bin'}: format version") as info:
        selector._load(tmp_path / "old.bin", "ns", tmp_path / "spool", tmp_path / "model")
    assert isinstance(info.value.__cause__, UnsupportedVersion)


@pytest.mark.parametrize("damage", [_flip(HEADER.size + 2), lambda b: b[:8] + struct.pack("<I", 7) + b[12:]])
def test_a_damaged_tree_file_gives_the_framing_reason(tmp_path: Path, damage) -> None:
    from bunshin.engine.prefix.persist import load_tree, save_tree
    from bunshin.engine.prefix.tree import Namespace, PrefixTree

    tree = PrefixTree(clock=lambda: 0.0)
    tree.root(Namespace(suite="webshop", task_id="1", config=Namespace.digest("cfg", 1)), "ready")
    save_tree(tree, tmp_path / "tree")
    (tmp_path / "tree").write_bytes(damage(bytearray((tmp_path / "tree").read_bytes())))
    loaded = load_tree(tmp_path / "tree", clock=lambda: 0.0)
    assert loaded.reason is not None and str(tmp_path / "tree") in loaded.reason and not loaded.tree.nodes
    assert "checksum mismatch" in loaded.reason or "format version 7, this reader knows 1" in loaded.reason
