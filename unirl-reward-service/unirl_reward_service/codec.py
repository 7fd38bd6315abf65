"""Decoding request payloads: base64 PNG/JPEG images and frames, base64 mp4 videos.

Every failure raises :class:`DecodeError` whose message starts with the payload's location
(``images[3]``, ``videos[1][0]``), which the app returns as a 422.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
import torch
from PIL import Image
from torch import Tensor

IMAGE_FORMATS = ("PNG", "JPEG")


class DecodeError(ValueError):
    """A payload item cannot be decoded; the message names its index."""


class TooLarge(ValueError):
    """A payload item exceeds a server limit (pixels or frames)."""


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


def decode_image(text: str, where: str, max_pixels: int) -> Tensor:
    """A base64 PNG or JPEG -> ``uint8[3, H, W]`` RGB (other modes are converted to RGB)."""
    data = b64_bytes(text, where)
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in IMAGE_FORMATS:
                raise DecodeError(f"{where}: {image.format} image; send PNG or JPEG")
            width, height = image.size
            if width * height > max_pixels:
                raise TooLarge(
                    f"{where}: {width}x{height} image has {width * height} pixels; "
                    f"this server accepts at most {max_pixels} (server.max_image_pixels)"
                )
            pixels = np.asarray(image.convert("RGB"))
    except (DecodeError, TooLarge):
        raise
    except Exception as exc:  # PIL raises many types for corrupt data; all are client errors
        raise DecodeError(
            f"{where}: not a decodable PNG or JPEG image ({type(exc).__name__}: {exc})"
        ) from exc
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()


def decode_mp4(text: str, where: str, max_frames: int, max_pixels: int) -> list[Tensor]:
    """A base64 mp4 -> its frames as ``uint8[3, H, W]`` RGB tensors (needs PyAV)."""
    try:
        import av
    except ImportError as exc:
        raise DecodeError(
            f"{where}: mp4 videos need PyAV on the server: "
            "pip install 'unirl-reward-service[video]' (or send the video as a list of frames)"
        ) from exc
    data = b64_bytes(text, where)
    frames: list[Tensor] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise DecodeError(f"{where}: the mp4 has no video stream")
            for frame in container.decode(video=0):
                if len(frames) == max_frames:
                    raise TooLarge(
                        f"{where}: video has more than {max_frames} frames "
                        "(server.max_frames); send fewer frames"
                    )
                if frame.width * frame.height > max_pixels:
                    raise TooLarge(
                        f"{where}: {frame.width}x{frame.height} frames exceed "
                        f"server.max_image_pixels={max_pixels}"
                    )
                pixels = frame.to_ndarray(format="rgb24")
                frames.append(torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous())
    except (DecodeError, TooLarge):
        raise
    except Exception as exc:  # PyAV raises its own error types for corrupt data
        raise DecodeError(f"{where}: not a decodable mp4 ({type(exc).__name__}: {exc})") from exc
    if not frames:
        raise DecodeError(f"{where}: the mp4 decoded to zero frames")
    return frames


def encode_png(pixels: np.ndarray) -> str:
    """``uint8[H, W, 3]`` -> base64 PNG (lossless; used by tests and examples)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
