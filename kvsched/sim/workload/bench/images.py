"""An image's size from its file's header (PNG, JPEG, GIF, WebP, BMP),
without decoding it: what the server's processor needs to count its
tokens. ``image_reference_size`` reads a dataset's reference to an image
(a local path, a ``file://`` URL or a base64 ``data:`` URL); http(s) URLs
are refused (kvsched downloads nothing)."""

from __future__ import annotations

import base64
import binascii
import struct
from pathlib import Path
from urllib.parse import unquote, urlparse

from kvsched.errors import UserInputError

# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic):
# C0-CF but DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers that stand alone (no length): TEM, RST0-7, SOI.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})
# Bytes read from a file: every header above fits well within it, but a
# JPEG's frame header may follow large EXIF / ICC segments.
MAX_HEADER_BYTES = 1 << 22


def image_size(data: bytes, where: str) -> tuple[int, int]:
    """(height, width) of an encoded image from its header; ``where`` names
    it in the error when the format is none of PNG, JPEG, GIF, WebP, BMP."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return height, width
    if data.startswith(b"BM") and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        return abs(height), width
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP" and len(data) >= 30:
        return _webp_size(data, where)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data, where)
    raise UserInputError(f"{where}: not a PNG, JPEG, GIF, WebP or BMP image (its first bytes: "
                         f"{data[:8].hex()}); convert it to one of those")


def _webp_size(data: bytes, where: str) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X":
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return height, width
    if chunk == b"VP8L" and data[20] == 0x2F:
        b0, b1, b2, b3 = data[21:25]
        width = 1 + (b0 | (b1 & 0x3F) << 8)
        height = 1 + (b1 >> 6 | b2 << 2 | (b3 & 0x0F) << 10)
        return height, width
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return height & 0x3FFF, width & 0x3FFF
    raise UserInputError(f"{where}: a WebP file kvsched cannot read the size of (chunk {chunk!r})")


def _jpeg_size(data: bytes, where: str) -> tuple[int, int]:
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_STANDALONE:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker in _JPEG_SOF and i + 9 <= n:
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return height, width
        i += 2 + length
    raise UserInputError(f"{where}: a JPEG without a frame header in its first {MAX_HEADER_BYTES:,} bytes")


def image_reference_size(ref: str, base: Path) -> tuple[int, int]:
    """(height, width) of the image a dataset names: a ``data:`` URL
    (base64), a ``file://`` URL, or a path (relative to ``base``, the
    dataset file's directory)."""
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if not header.endswith(";base64"):
            raise UserInputError(f"image {ref[:40]!r}...: a data: URL must be base64 "
                                 "(data:image/...;base64,)")
        try:
            data = base64.b64decode(payload[:MAX_HEADER_BYTES * 4 // 3 + 4], validate=False)
        except (binascii.Error, ValueError) as e:
            raise UserInputError(f"image {ref[:40]!r}...: bad base64 ({e})") from None
        return image_size(data, f"image {ref[:40]!r}...")
    parsed = urlparse(ref)
    if parsed.scheme in ("http", "https"):
        raise UserInputError(f"image {ref!r}: kvsched reads no URL (it downloads nothing); save the image "
                             "and name its local path in the dataset")
    path = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(ref)
    if not path.is_absolute():
        path = base / path
    try:
        with path.open("rb") as f:
            data = f.read(MAX_HEADER_BYTES)
    except OSError as e:
        raise UserInputError(f"image {ref!r}: cannot read {path} ({e.strerror}); give a path to an image "
                             "file, absolute or relative to the dataset file") from None
    return image_size(data, str(path))
