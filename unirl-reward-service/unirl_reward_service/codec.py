"""Decoding request payloads: base64 PNG/JPEG images and frames, base64 mp4 videos.

Two steps, so no pixel is decoded before every size is known: :func:`probe_image` and
:func:`probe_mp4` read only the headers (width, height and, for mp4, the frame count) and
return a :class:`Payload`; the app sums those sizes against its pixel budgets and only then
calls :func:`decode_payload`. Failures raise :class:`DecodeError` (the app answers 422) or
:class:`TooLarge` (413); both messages start with the payload's location (``images[3]``,
``videos[1][0]``).
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch import Tensor

IMAGE_FORMATS = ("PNG", "JPEG")
_MAGIC = {b"GIF8": "GIF", b"BM": "BMP", b"II*\x00": "TIFF", b"MM\x00*": "TIFF", b"RIFF": "WEBP"}


class DecodeError(ValueError):
    """A payload item cannot be decoded; the message names its index."""


class TooLarge(ValueError):
    """A payload item exceeds a server limit (pixels or frames)."""


@dataclass(frozen=True, kw_only=True)
class Payload:
    """One image, frame or mp4 as bytes, with the size its header declares."""

    where: str
    kind: Literal["image", "mp4"]
    data: bytes
    width: int
    height: int
    frames: int = 1

    @property
    def pixels(self) -> int:
        """``frames·H·W``: what decoding it would hold (3 bytes each as ``uint8`` RGB)."""
        return self.frames * self.width * self.height


def b64_bytes(text: str, where: str) -> bytes:
    """Bytes of a base64 string (an optional ``data:...;base64,`` prefix is stripped)."""
    if text.startswith("data:"):
        head, sep, rest = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise DecodeError(f"{where}: data URL must be 'data:<type>;base64,<payload>'")
        text = rest
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(f"{where}: not valid base64 ({exc})") from exc
    if not data:
        raise DecodeError(f"{where}: empty payload")
    return data


def _too_many_pixels(where: str, width: int, height: int, max_pixels: int) -> TooLarge:
    return TooLarge(
        f"{where}: {width}x{height} image has {width * height} pixels; "
        f"this server accepts at most {max_pixels} (server.max_image_pixels)"
    )


def _open_image(data: bytes, where: str, max_pixels: int) -> Image.Image:
    """Open (headers only, no pixel is decoded) and check the format and ``H·W``.

    Only the PNG and JPEG parsers ever see the bytes. Pillow's own decompression-bomb check
    runs inside ``Image.open`` for sizes far above any sane limit; its error is a 413 too,
    and our ``max_image_pixels`` check below does not depend on it (nor on its warning).
    """
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as exc:
        raise TooLarge(
            f"{where}: {exc} This server accepts at most {max_pixels} pixels per image "
            "(server.max_image_pixels)"
        ) from exc
    except Exception as exc:  # PIL raises many types for corrupt data; all are client errors
        found = next((name for magic, name in _MAGIC.items() if data.startswith(magic)), None)
        if found is not None:
            raise DecodeError(f"{where}: {found} image; send PNG or JPEG") from exc
        raise DecodeError(
            f"{where}: not a decodable PNG or JPEG image ({type(exc).__name__}: {exc})"
        ) from exc
    if image.format not in IMAGE_FORMATS:  # e.g. MPO, which the JPEG parser also opens
        image.close()
        raise DecodeError(f"{where}: {image.format} image; send PNG or JPEG")
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise _too_many_pixels(where, width, height, max_pixels)
    return image


def probe_image(text: str, where: str, max_pixels: int) -> Payload:
    """A base64 PNG or JPEG -> its bytes and header size; checks ``H·W <= max_pixels``."""
    data = b64_bytes(text, where)
    with _open_image(data, where, max_pixels) as image:
        width, height = image.size
    return Payload(where=where, kind="image", data=data, width=width, height=height)


def probe_mp4(text: str, where: str, max_frames: int, max_pixels: int) -> Payload:
    """A base64 mp4 -> its bytes, frame size and frame count from the container header.

    No frame is decoded. A header without a frame count (e.g. a fragmented mp4) is counted
    as ``max_frames`` frames, the most decoding will accept; a codec whose frame size is
    not in the header is refused (422).
    """
    av = _import_av(where)
    data = b64_bytes(text, where)
    try:
        # max_pixels=1: FFmpeg decodes frames while reading stream info; here it cannot, and
        # the size and frame count still come from the container and codec headers.
        with _open_mp4(av, data, 1) as container:
            if not container.streams.video:
                raise DecodeError(f"{where}: the mp4 has no video stream")
            stream = container.streams.video[0]
            width, height, frames = stream.width, stream.height, stream.frames
    except DecodeError:
        raise
    except Exception as exc:  # PyAV raises its own error types for corrupt data
        raise DecodeError(f"{where}: not a decodable mp4 ({type(exc).__name__}: {exc})") from exc
    if width <= 0 or height <= 0:
        raise DecodeError(f"{where}: the mp4 header gives no frame size ({width}x{height})")
    if width * height > max_pixels:
        raise TooLarge(
            f"{where}: {width}x{height} frames exceed server.max_image_pixels={max_pixels}"
        )
    if frames > max_frames:
        raise TooLarge(
            f"{where}: video has {frames} frames; this server accepts at most {max_frames} "
            "per video (server.max_frames): send fewer frames"
        )
    frames = frames if frames > 0 else max_frames
    return Payload(where=where, kind="mp4", data=data, width=width, height=height, frames=frames)


def decode_payload(payload: Payload) -> list[Tensor]:
    """Decode a probed payload to ``uint8[3, H, W]`` RGB tensors (one, or the mp4's frames).

    Decoding never holds more than ``payload.pixels``: an mp4 whose frames turn out larger
    or more numerous than its header said is refused (413) at the first frame over.
    """
    if payload.kind == "image":
        return [_decode_image(payload)]
    return _decode_mp4(payload)


def _decode_image(payload: Payload) -> Tensor:
    where = payload.where
    try:
        with _open_image(payload.data, where, payload.pixels) as image:
            rgb = image.convert("RGB")
            pixels = np.array(rgb)
            rgb.close()
    except (DecodeError, TooLarge):
        raise
    except Exception as exc:  # PIL raises many types for corrupt data; all are client errors
        raise DecodeError(
            f"{where}: not a decodable PNG or JPEG image ({type(exc).__name__}: {exc})"
        ) from exc
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def _decode_mp4(payload: Payload) -> list[Tensor]:
    where = payload.where
    av = _import_av(where)
    # The decoder refuses frames above the header's size, whatever the bitstream says (the
    # margin covers the row alignment FFmpeg adds before comparing with max_pixels).
    decoder_pixels = (payload.width + 128) * (payload.height + 64)
    frames: list[Tensor] = []
    held = 0
    try:
        with _open_mp4(av, payload.data, decoder_pixels) as container:
            stream = container.streams.video[0]
            stream.codec_context.options = {"max_pixels": str(decoder_pixels), "threads": "1"}
            for frame in container.decode(stream):
                held += frame.width * frame.height
                if len(frames) == payload.frames or held > payload.pixels:
                    raise TooLarge(
                        f"{where}: the mp4 decodes to more than the {payload.frames} frames of "
                        f"{payload.width}x{payload.height} its header declares (or the "
                        "server.max_frames counted for a header without a frame count)"
                    )
                pixels = frame.to_ndarray(format="rgb24")
                frames.append(torch.from_numpy(pixels).permute(2, 0, 1).contiguous())
    except (DecodeError, TooLarge):
        raise
    except Exception as exc:  # PyAV raises its own error types for corrupt data
        raise DecodeError(f"{where}: not a decodable mp4 ({type(exc).__name__}: {exc})") from exc
    if not frames:
        raise DecodeError(f"{where}: the mp4 decoded to zero frames")
    return frames


def _import_av(where: str) -> Any:
    try:
        import av
    except ImportError as exc:
        raise DecodeError(
            f"{where}: mp4 videos need PyAV on the server: "
            "pip install 'unirl-reward-service[video]' (or send the video as a list of frames)"
        ) from exc
    return av


def _open_mp4(av: Any, data: bytes, max_pixels: int) -> Any:
    """Open with the mp4 demuxer only (no format probing: playlists and the like never open
    files or URLs), one decoder thread, and the decoder's ``max_pixels`` (which also holds
    for the frames FFmpeg decodes while it reads the stream info)."""
    options = {"max_pixels": str(max_pixels), "threads": "1"}
    return av.open(io.BytesIO(data), mode="r", format="mp4", options=options)


def encode_png(pixels: np.ndarray) -> str:
    """``uint8[H, W, 3]`` -> base64 PNG (lossless; used by tests and examples)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
