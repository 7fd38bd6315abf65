"""VideoAlign's VideoReward (Liu et al., 2025): a Qwen2-VL-2B backbone reads the video and a
prompt holding three reward tokens; a bias-free linear head maps the hidden state at each
token to visual quality (VQ), motion quality (MQ) and text alignment (TA)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import (
    RewardError,
    ScoreResult,
    check_video_call,
)
from unirl.reward.local.vlm.engine import QwenVLScorer, sample_frames, video_chat
from unirl.reward.local.vlm.templates import VIDEOALIGN_PROMPT, VIDEOALIGN_TOKENS

DIMENSIONS = ("VQ", "MQ", "TA")
# inference_config of the released model_config.json as reproduced in public VideoReward
# wrappers (not read from the checkpoint here; check yours, see docs/rewards.md)
RELEASED_MEAN = {"VQ": 3.6757, "MQ": 1.1646, "TA": 2.8105}
RELEASED_STD = {"VQ": 2.2476, "MQ": 1.3811, "TA": 2.5121}


def videoalign_text(prompt: str) -> str:
    """The text after the video in VideoReward's user turn."""
    return VIDEOALIGN_PROMPT.format(text_prompt=prompt)


@dataclass(kw_only=True)
class VideoAlign(QwenVLScorer):
    """VideoReward score of a video for its prompt: ``Σ_d weights[d] · r_d``.

    The video's frames at ``sample_fps`` (at most ``max_frames``, even count; the last frame
    repeated when odd) go in one user turn, then the released "detailed_special" prompt with
    ``<|VQ_reward|>``, ``<|MQ_reward|>``, ``<|TA_reward|>``; one forward pass, right padding,
    sequential positions. ``r_d = w · h_d`` (the head ``Linear(H, 1, bias=False)`` at the
    hidden state of token ``d``), normalised ``(r_d - mean[d]) / std[d]`` when ``normalize``
    (the reference's ``use_norm=True``). Default weights 1 / 1 / 1: the reference's
    ``Overall = VQ + MQ + TA``. ``<name>/VQ|MQ|TA`` log the (normalised) dimensions.

    ``path``: a folder with the backbone, the three tokens in its tokenizer and
    ``reward_head.safetensors`` (key ``rm_head.weight`` ``[1, H]``), as
    ``python -m unirl.reward.local.vlm.convert --kind videoalign`` writes. ``max_pixels``
    bounds each frame.
    """

    path: str  # folder (or hub id) converted from KwaiVGI/VideoReward: backbone, tokenizer with the 3 reward tokens, reward_head.safetensors
    name: str = "videoalign"  # component name of the score
    batch_size: int = 2  # videos per forward pass
    max_pixels: int | None = 448 * 448  # each frame's pixel upper bound after resizing
    sample_fps: float = 2.0  # frames per second fed to the model (the release samples at 2)
    max_frames: int = 32  # at most this many frames per video, spread over the clip
    # weight of each dimension (VQ, MQ, TA) in the score
    weights: dict[str, float] = field(default_factory=lambda: {"VQ": 1.0, "MQ": 1.0, "TA": 1.0})
    normalize: bool = True  # standardise each dimension with mean / std first
    # per-dimension mean subtracted when normalize (the release's inference_config)
    mean: dict[str, float] = field(default_factory=lambda: dict(RELEASED_MEAN))
    # per-dimension std divided by when normalize (the release's inference_config)
    std: dict[str, float] = field(default_factory=lambda: dict(RELEASED_STD))

    reward_tokens: ClassVar[tuple[str, ...]] = VIDEOALIGN_TOKENS

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("weights", "mean", "std"):
            value = dict(getattr(self, key))
            require(
                set(value) == set(DIMENSIONS),
                f"VideoAlign.{key} must have exactly the keys VQ, MQ, TA; got {sorted(value)}",
            )
            setattr(self, key, {k: float(v) for k, v in value.items()})
        require(all(v > 0 for v in self.std.values()), "VideoAlign.std: every value must be > 0")
        require(self.sample_fps > 0, f"VideoAlign.sample_fps={self.sample_fps}: use a value > 0")
        require(
            isinstance(self.max_frames, int) and self.max_frames >= 2,
            f"VideoAlign.max_frames={self.max_frames!r}: use an integer >= 2",
        )

    def _after_load(self) -> None:
        self._load_head(
            {"rm_head": torch.nn.Linear(self.hidden_size, 1, bias=False)}, "VideoReward head"
        )

    def dimensions(self, frames: Tensor, fps: float, prompts: list[str]) -> Tensor:
        """``[b, 3]`` raw ``(VQ, MQ, TA)`` for ``frames[b, T, 3, H, W]`` in [0, 1]."""
        chosen = sample_frames(frames.shape[1], fps, self.sample_fps, self.max_frames)
        pixels = frames[:, chosen].detach().float().clamp(0, 1).mul(255).round().to(torch.uint8)
        u8 = pixels.permute(0, 1, 3, 4, 2).cpu().numpy()
        batch = self.build_batch(
            [video_chat(videoalign_text(p)) for p in prompts], [[("video", v)] for v in u8]
        )
        hidden = self.hidden_at(batch, self.reward_tokens)  # [b, 3, H]
        return self._head.rm_head(hidden).squeeze(-1)

    def combine(self, raw: Tensor) -> tuple[Tensor, Tensor]:
        """``(score[b], per-dimension[b, 3])`` from raw head outputs."""
        dims = raw.double()
        if self.normalize:
            mean = torch.tensor([self.mean[d] for d in DIMENSIONS], dtype=dims.dtype)
            std = torch.tensor([self.std[d] for d in DIMENSIONS], dtype=dims.dtype)
            dims = (dims - mean.to(dims.device)) / std.to(dims.device)
        w = torch.tensor(
            [self.weights[d] for d in DIMENSIONS], dtype=dims.dtype, device=dims.device
        )
        return dims @ w, dims

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        raise RewardError(
            "VideoAlign scores videos (frames[N, T, 3, H, W] through score_video), but the track "
            "decoded images; use HPSv3 or another image reward for image tracks"
        )

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        n = len(prompts)
        frames = check_video_call(frames, prompts, metadata, "VideoAlign", fps)

        def call(start: int, stop: int):
            total, dims = self.combine(
                self.dimensions(frames[start:stop], fps, list(prompts[start:stop]))
            )
            extras = {d: dims[:, i] for i, d in enumerate(DIMENSIONS)}
            return total, [None] * (stop - start), extras

        values, errors, metrics = self._chunked(n, call)
        return self._finish(values, errors, metrics)
