"""apps.encryption.crypto chunked streams (format 2): fixed-size AES-256-GCM chunks bound to row, index and final flag."""

from __future__ import annotations

import base64
import os

import pytest

from apps.encryption import crypto

K1 = base64.b64encode(b"\x01" * 32).decode()
K2 = base64.b64encode(b"\x02" * 32).decode()
CHUNK = 1024


@pytest.fixture
def ring(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    return settings


def seal(data: bytes, *, piece: int = 777, row_id: str = "row", chunk_size: int = CHUNK) -> bytes:
    pieces = [data[i : i + piece] for i in range(0, len(data), piece)] or [b""]
    return b"".join(crypto.seal_stream(pieces, purpose="p", row_id=row_id, chunk_size=chunk_size))


def open_all(blob: bytes, *, piece: int = 1000, row_id: str = "row") -> bytes:
    pieces = [blob[i : i + piece] for i in range(0, len(blob), piece)]
    return b"".join(crypto.open_stream(pieces, purpose="p", row_id=row_id))


def split(blob: bytes) -> tuple[bytes, list[bytes]]:
    header_len = 4 + blob[3] + 4
    sealed = crypto.NONCE_BYTES + CHUNK + crypto.TAG_BYTES
    body = blob[header_len:]
    return blob[:header_len], [body[i : i + sealed] for i in range(0, len(body), sealed)]


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 5])
@pytest.mark.parametrize("piece", [1, 100, CHUNK, 5000])
def test_round_trip_any_sizes_and_pieces(ring, size, piece):
    data = os.urandom(size)
    blob = seal(data, piece=piece)
    assert len(blob) == size + crypto.stream_overhead(size, chunk_size=CHUNK)
    for read_piece in (1, 333, len(blob)):
        assert open_all(blob, piece=read_piece) == data


def test_plaintext_does_not_appear(ring):
    data = b"PLAINTEXT-MARKER" * 500
    assert b"PLAINTEXT" not in seal(data)


def test_chunks_have_fresh_nonces(ring):
    _, chunks = split(seal(b"\x00" * (4 * CHUNK)))
    nonces = {chunk[: crypto.NONCE_BYTES] for chunk in chunks}
    assert len(nonces) == len(chunks) == 4


@pytest.mark.parametrize(
    "damage",
    [
        lambda h, c: h + b"".join([c[1], c[0], *c[2:]]),  # swapped
        lambda h, c: h + b"".join(c[:-1]),  # cut at a chunk boundary
        lambda h, c: h + b"".join(c)[:-1],  # cut inside the final chunk
        lambda h, c: h + b"".join(c[1:]),  # first chunk dropped
        lambda h, c: h + b"".join([*c, c[-1]]),  # final chunk repeated
        lambda h, c: h + b"".join([*c[:2], c[1], *c[2:]]),  # a chunk duplicated
        lambda h, c: h,  # only the header
        lambda h, c: h[:-1],  # not even the header
        lambda h, c: h[:4] + b"\x00\x00\x08\x00" + b"".join(c),  # chunk size edited
        lambda h, c: b"MS\x01" + h[3:] + b"".join(c),  # version edited
    ],
)
def test_reordering_truncation_and_edits_fail(ring, damage):
    header, chunks = split(seal(os.urandom(3 * CHUNK + 10)))
    assert len(chunks) == 4
    with pytest.raises(crypto.DecryptionError):
        open_all(damage(header, chunks))


def test_every_byte_is_authenticated(ring):
    blob = seal(os.urandom(2 * CHUNK + 3))
    for position in range(0, len(blob), 97):
        damaged = blob[:position] + bytes([blob[position] ^ 0x40]) + blob[position + 1 :]
        with pytest.raises(crypto.DecryptionError):
            open_all(damaged)


def test_bound_to_row_and_purpose(ring):
    blob = seal(b"data", row_id="a")
    with pytest.raises(crypto.DecryptionError):
        open_all(blob, row_id="b")
    with pytest.raises(crypto.DecryptionError):
        b"".join(crypto.open_stream([blob], purpose="other", row_id="a"))


def test_no_plaintext_before_its_chunk_authenticates(ring):
    header, chunks = split(seal(os.urandom(3 * CHUNK)))
    chunks[1] = chunks[1][:-1] + bytes([chunks[1][-1] ^ 1])
    blob = header + b"".join(chunks)
    opened = []
    with pytest.raises(crypto.DecryptionError):
        for plain in crypto.open_stream(
            [blob[i : i + 100] for i in range(0, len(blob), 100)], purpose="p", row_id="row"
        ):
            opened.append(plain)
    assert len(b"".join(opened)) == CHUNK  # only the first (authentic) chunk came out


def test_old_keys_still_open_after_rotation(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    blob = seal(b"before rotation")
    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2},k1:{K1}"
    assert open_all(blob) == b"before rotation"
    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2}"
    with pytest.raises(crypto.DecryptionError):
        open_all(blob)


def test_is_sealed_stream(ring):
    assert crypto.is_sealed_stream(seal(b"x"))
    assert not crypto.is_sealed_stream(crypto.encrypt(b"x", purpose="p", row_id="r"))
    assert not crypto.is_sealed_stream(b"plain")
