"""The engine the VLM rewards share: a Qwen2-VL / Qwen2.5-VL folder loaded once, chats
rendered through the folder's own chat template, images and videos turned into the model's
patches, and two ways to read a verdict: the hidden states at reward tokens (trained reward
heads: HPSv3, VideoAlign, EditReward) or greedy, KV-cached generation (judges: UnifiedReward,
WISE).

A sample is a chat (``messages``, each ``{"type": "image"}`` / ``{"type": "video"}`` entry a
placeholder) plus its visuals in the same order: ``("image", uint8[H, W, 3])`` or
``("video", uint8[T, H, W, 3])``. The chat template renders each placeholder as one image /
video pad token; the engine repeats it once per merged patch, tokenises the text between the
pads on its own (the pads are special tokens, so this equals tokenising the whole text) and
pads the batch on the ``padding_side`` of the reward.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NotRequired, TypedDict

import numpy as np
import torch
from torch import Tensor, nn

from unirl.config import require
from unirl.reward.base import RewardError, ScoreResult
from unirl.reward.local._hf import (
    PretrainedScorer,
    RewardWeightsNotFound,
    load_pretrained,
    load_state_dict_file,
    pretrained_file,
)

Visual = tuple[str, np.ndarray]


class ChatPart(TypedDict):
    """One piece of a chat turn's content: ``{"type": "image"}`` (a placeholder the template
    expands), ``{"type": "video"}`` or ``{"type": "text", "text": ...}``."""

    type: str
    text: NotRequired[str]


class ChatTurn(TypedDict):
    """One turn of the chat a judge is shown (what ``apply_chat_template`` reads)."""

    role: str
    content: list[ChatPart]


# ``call(start, stop) -> (values[b], errors[b], extras {name: Tensor[b]})`` of ``_chunked``
ChunkCall = Callable[[int, int], tuple[Tensor, list[str | None], Mapping[str, Tensor]]]
HEAD_FILE = "reward_head.safetensors"
CONVERT_HINT = (
    "convert the released checkpoint once with `python -m unirl.reward.local.vlm.convert` "
    "(see docs/rewards.md#vlm-rewards)"
)


def video_patches(
    frame_pixels: Tensor, frame_grid: Tensor, temporal_patch_size: int
) -> tuple[Tensor, list[int]]:
    """Qwen2-VL video patches from the image processor's patches of its ``T`` frames.

    The image processor writes each frame as ``gh·gw`` rows of ``(C, tp, p, p)`` values with
    the frame copied ``tp`` times; a video row instead holds ``tp`` consecutive frames. Rows
    stay in the image order ``(gh/m, gw/m, m, m)``; a frame count that is not a multiple of
    ``tp`` repeats the last frame (as the video processor does). Returns ``(patches[T/tp·gh·gw,
    C·tp·p·p], [T/tp, gh, gw])``."""
    t = int(frame_grid.shape[0])
    gh, gw = (int(v) for v in frame_grid[0, 1:])
    require(
        bool((frame_grid[:, 1:] == frame_grid[0, 1:]).all()),
        "video frames must share one size",
    )
    rows = gh * gw
    per = frame_pixels.reshape(t, rows, 3, temporal_patch_size, -1)[:, :, :, 0]  # [T, R, C, pp]
    if t % temporal_patch_size:
        pad = temporal_patch_size - t % temporal_patch_size
        per = torch.cat([per, per[-1:].expand(pad, -1, -1, -1)], dim=0)
        t += pad
    grouped = per.reshape(t // temporal_patch_size, temporal_patch_size, rows, 3, -1)
    patches = grouped.permute(0, 2, 3, 1, 4).reshape(t // temporal_patch_size * rows, -1)
    return patches, [t // temporal_patch_size, gh, gw]


def sample_frames(num_frames: int, fps: float, sample_fps: float, max_frames: int) -> list[int]:
    """Frame indices at ``sample_fps`` from a clip at ``fps``: every ``round(fps / sample_fps)``
    frames from the first (all frames when ``sample_fps >= fps``), at most ``max_frames`` of
    them spread evenly over the clip."""
    stride = max(1, round(fps / sample_fps))
    chosen = list(range(0, num_frames, stride))
    if max_frames == 1:
        return chosen[:1]
    if len(chosen) > max_frames:
        chosen = [
            chosen[round(i * (len(chosen) - 1) / (max_frames - 1))] for i in range(max_frames)
        ]
    return chosen


def ranknet_head(hidden: int, out: int) -> nn.Sequential:
    """The released "ranknet" reward head of HPSv3 and EditReward: ``hidden -> 1024 -> ReLU ->
    dropout 0.05 -> 16 -> ReLU -> out`` (keys ``0``, ``3``, ``5``; dropout off at eval)."""
    return nn.Sequential(
        nn.Linear(hidden, 1024),
        nn.ReLU(),
        nn.Dropout(0.05),
        nn.Linear(1024, 16),
        nn.ReLU(),
        nn.Linear(16, out),
    )


@dataclass(kw_only=True)
class QwenVLScorer(PretrainedScorer):
    """Base of the VLM rewards: loading, chat rendering, vision patches, padding.

    ``path``: a hub id or a local folder with a Qwen2-VL / Qwen2.5-VL model (config, weights),
    its tokenizer (with a chat template, or give ``chat_template``) and its image processor.
    ``min_pixels`` / ``max_pixels``: bounds on each image's pixels after the processor's resize
    to multiples of 28 (``None``: the folder's). Images are quantised to ``uint8`` first, as a
    PIL image would be. Weights load on the first score.
    """

    path: str  # hub id or local folder of the Qwen2-VL / Qwen2.5-VL model, tokenizer and image processor
    chat_template: str | None = (
        None  # Jinja chat template to use instead of the tokenizer's (null: the folder's)
    )
    min_pixels: int | None = (
        None  # lower bound on each image's pixels after resizing (null: the processor's)
    )
    max_pixels: int | None = (
        None  # upper bound on each image's pixels after resizing (null: the processor's)
    )

    padding_side: ClassVar[str] = "right"
    reward_tokens: ClassVar[tuple[str, ...]] = ()

    _model: Any = field(init=False, repr=False, compare=False, default=None)
    _tokenizer: Any = field(init=False, repr=False, compare=False, default=None)
    _processor: Any = field(init=False, repr=False, compare=False, default=None)
    _pads: dict = field(init=False, repr=False, compare=False, default_factory=dict)
    _head: Any = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        require(bool(self.path), f"{owner}.path must name a hub id or a local folder")
        for key in ("min_pixels", "max_pixels"):
            value = getattr(self, key)
            require(
                value is None or (isinstance(value, int) and value > 0),
                f"{owner}.{key}={value!r}: use a positive integer or null",
            )
        if self.min_pixels is not None and self.max_pixels is not None:
            require(
                self.min_pixels <= self.max_pixels,
                f"{owner}: min_pixels={self.min_pixels} is above max_pixels={self.max_pixels}",
            )

    # -- loading ---------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            from transformers import (
                MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
                AutoConfig,
                AutoImageProcessor,
                AutoTokenizer,
            )
        except ImportError as exc:
            raise ImportError(
                f"{type(self).__name__} needs transformers: pip install 'transformers>=4.50'"
            ) from exc
        owner = type(self).__name__
        config = load_pretrained(
            AutoConfig.from_pretrained, self.path, owner=owner, field_name="path"
        )
        model_cls: Any = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING.get(type(config), None)
        if model_cls is None or getattr(config, "image_token_id", None) is None:
            raise RewardError(
                f"{owner}: {self.path!r} holds a {type(config).__name__} (model_type "
                f"{getattr(config, 'model_type', '?')!r}); set path= to a Qwen2-VL / Qwen2.5-VL "
                "folder or hub id"
            )
        # the concrete class, not AutoModel*: it does not look for a PEFT adapter on the hub
        model = load_pretrained(
            model_cls.from_pretrained,
            self.path,
            owner=owner,
            field_name="path",
            config=config,
            dtype=self.torch_dtype,
        )
        tokenizer = load_pretrained(
            AutoTokenizer.from_pretrained, self.path, owner=owner, field_name="path"
        )
        processor = load_pretrained(
            AutoImageProcessor.from_pretrained, self.path, owner=owner, field_name="path"
        )
        if not hasattr(processor, "merge_size"):
            raise RewardError(
                f"{owner}: the image processor in {self.path!r} is a "
                f"{type(processor).__name__}; a Qwen2-VL image processor (merge_size) is needed"
            )
        if self.chat_template is not None:
            tokenizer.chat_template = self.chat_template
        if not getattr(tokenizer, "chat_template", None):
            raise RewardError(
                f"{owner}: the tokenizer in {self.path!r} has no chat template; set "
                "chat_template= to the model's Jinja template"
            )
        added = tokenizer.get_added_vocab()
        missing = [t for t in self.reward_tokens if t not in added]
        if missing:
            raise RewardError(
                f"{owner}: the tokenizer in {self.path!r} lacks the reward token(s) "
                f"{', '.join(missing)}; {CONVERT_HINT}"
            )
        self._pads = {
            "image": (
                int(config.image_token_id),
                tokenizer.convert_ids_to_tokens(int(config.image_token_id)),
            ),
            "video": (
                int(config.video_token_id),
                tokenizer.convert_ids_to_tokens(int(config.video_token_id)),
            ),
        }
        self._model = model.to(self.torch_device)
        self._tokenizer = tokenizer
        self._processor = processor
        self._after_load()

    def _after_load(self) -> None:
        """Hook: load heads, check tokens (the model, tokenizer and processor are set)."""

    def _modules(self) -> list[nn.Module]:
        return [m for m in (self._model, self._head) if m is not None]

    def _score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        raise TypeError(f"{type(self).__name__} scores through its own score method")

    def _load_head(self, build: dict[str, nn.Module], where: str) -> None:
        """Load ``reward_head.safetensors`` of ``path`` strictly into ``build`` (``{key prefix:
        module}``, e.g. ``{"rm_head": ranknet_head(h, 2)}``); modules stay fp32 on the device."""
        owner = type(self).__name__
        file = pretrained_file(self.path, HEAD_FILE, owner=owner, field_name="path")
        if file is None:
            raise RewardWeightsNotFound(
                f"{owner}: {self.path!r} has no {HEAD_FILE} (the {where}); {CONVERT_HINT}"
            )
        state = load_state_dict_file(file, owner=owner, field_name="path")
        holder = nn.Module()
        for prefix, module in build.items():
            holder.add_module(prefix, module)
        try:
            holder.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0]
            raise RewardError(
                f"{owner}: {file} does not match the {where} ({first}); {CONVERT_HINT}"
            ) from exc
        holder.to(device=self.torch_device, dtype=torch.float32).eval().requires_grad_(False)
        self._head = holder

    @property
    def hidden_size(self) -> int:
        config = self._model.config
        text = getattr(config, "text_config", None)
        return int(getattr(text, "hidden_size", None) or config.hidden_size)

    # -- inputs ----------------------------------------------------------------------------
    def render(self, messages: list[ChatTurn]) -> str:
        """The chat as text, generation prompt appended (placeholders not yet expanded)."""
        return str(
            self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        )

    def _encode_text(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False).input_ids)

    @property
    def frame_pixels(self) -> int | None:
        """The pixel upper bound of each video frame (``max_pixels`` unless a reward says)."""
        return self.max_pixels

    def _size(self, low: int | None, high: int | None) -> dict[str, object]:
        """The image processor's ``size`` kwargs for pixel bounds ``[low, high]``."""
        if low is None and high is None:
            return {}
        size = dict(self._processor.size)
        if high is not None:
            size["longest_edge"] = high
        size["shortest_edge"] = (
            low
            if low is not None
            else min(int(size.get("shortest_edge") or 0), size["longest_edge"])
        )
        return {"size": size}

    def _vision(self, visuals: list[list[Visual]]) -> tuple[dict[str, Tensor], list[list[int]]]:
        """Pixel tensors of every image and video in the batch, and per sample the number of
        pad tokens of each of its visuals (in order)."""
        proc = self._processor
        kwargs = self._size(self.min_pixels, self.max_pixels)
        frame_kwargs = self._size(None, self.frame_pixels)
        merge = int(proc.merge_size) ** 2
        images = [a for sample in visuals for kind, a in sample if kind == "image"]
        out: dict[str, Tensor] = {}
        image_counts: list[int] = []
        if images:
            vision = proc(images=images, return_tensors="pt", **kwargs)
            out["pixel_values"] = vision["pixel_values"]
            out["image_grid_thw"] = vision["image_grid_thw"]
            image_counts = (vision["image_grid_thw"].prod(-1) // merge).tolist()
        video_pixels: list[Tensor] = []
        video_grids: list[list[int]] = []
        for sample in visuals:
            for kind, frames in sample:
                if kind != "video":
                    continue
                vision = proc(images=list(frames), return_tensors="pt", **frame_kwargs)
                patches, grid = video_patches(
                    vision["pixel_values"], vision["image_grid_thw"], int(proc.temporal_patch_size)
                )
                video_pixels.append(patches)
                video_grids.append(grid)
        if video_pixels:
            out["pixel_values_videos"] = torch.cat(video_pixels)
            out["video_grid_thw"] = torch.tensor(video_grids, dtype=torch.long)
        video_counts = [g[0] * g[1] * g[2] // merge for g in video_grids]
        counts: list[list[int]] = []
        next_image = next_video = 0
        for sample in visuals:
            row = []
            for kind, _ in sample:
                if kind == "image":
                    row.append(int(image_counts[next_image]))
                    next_image += 1
                else:
                    row.append(int(video_counts[next_video]))
                    next_video += 1
            counts.append(row)
        return out, counts

    def _row(self, text: str, kinds: list[str], counts: list[int], index: int) -> list[int]:
        """Token ids of one rendered chat with each pad token repeated ``counts[j]`` times."""
        (image_id, image_tok), (video_id, video_tok) = self._pads["image"], self._pads["video"]
        pieces = re.split(f"({re.escape(image_tok)}|{re.escape(video_tok)})", text)
        found = ["image" if p == image_tok else "video" for p in pieces[1::2]]
        if found != kinds:
            raise RewardError(
                f"{type(self).__name__}: sample {index}: the chat template rendered the visuals "
                f"{found} for {kinds} (a prompt containing {image_tok!r} or {video_tok!r}, or a "
                "template that does not render {'type': 'image'} as one placeholder)"
            )
        ids: list[int] = []
        for j, piece in enumerate(pieces):
            if j % 2 == 0:
                ids += self._encode_text(piece)
            else:
                ids += [image_id if piece == image_tok else video_id] * counts[j // 2]
        return ids

    def build_batch(
        self, chats: list[list[ChatTurn]], visuals: list[list[Visual]], suffix: str = ""
    ) -> dict[str, Tensor]:
        """Model inputs for ``chats`` (each rendered, then ``suffix`` appended) with their
        ``visuals``: ``input_ids`` / ``attention_mask`` padded on :attr:`padding_side`, plus
        the pixel tensors, all on the device."""
        vision, counts = self._vision(visuals)
        rows = [
            self._row(self.render(chat) + suffix, [k for k, _ in vis], cnt, i)
            for i, (chat, vis, cnt) in enumerate(zip(chats, visuals, counts, strict=True))
        ]
        length = max(len(r) for r in rows)
        pad = self._tokenizer.pad_token_id
        pad = self._tokenizer.eos_token_id if pad is None else pad
        ids = torch.full((len(rows), length), int(pad), dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            where = (
                slice(0, len(row))
                if self.padding_side == "right"
                else slice(length - len(row), length)
            )
            ids[i, where] = torch.tensor(row, dtype=torch.long)
            mask[i, where] = 1
        device = self.torch_device
        batch = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
        for key, value in vision.items():
            float_key = key.startswith("pixel_values")
            dtype = self._model.dtype if float_key else value.dtype
            batch[key] = value.to(device=device, dtype=dtype)
        return batch

    # -- readers ---------------------------------------------------------------------------
    def hidden_at(self, batch: dict[str, Tensor], tokens: tuple[str, ...]) -> Tensor:
        """Final hidden states ``[B, len(tokens), H]`` (fp32) at each reward token, one forward
        pass with sequential positions ``0..L-1`` on every M-RoPE axis: the released reward
        models call the language model with ``position_ids=None``, which means exactly this.
        Every sample must hold each token exactly once."""
        ids = batch["input_ids"]
        b, length = ids.shape
        positions = torch.arange(length, device=ids.device).expand(b, length)
        out = self._model.model(**batch, position_ids=positions, use_cache=False)
        hidden = out.last_hidden_state
        picked = []
        for token in tokens:
            token_id = int(self._tokenizer.convert_tokens_to_ids(token))
            hits = ids == token_id
            per_sample = hits.sum(-1)
            if not bool((per_sample == 1).all()):
                bad = int((per_sample != 1).nonzero()[0, 0])
                raise RewardError(
                    f"{type(self).__name__}: sample {bad} holds {int(per_sample[bad])} {token!r} "
                    "tokens (a prompt containing the reward token?); each sample needs exactly one"
                )
            picked.append(hidden[torch.arange(b, device=ids.device), hits.int().argmax(-1)])
        return torch.stack(picked, dim=1).float()

    def generate_texts(
        self, batch: dict[str, Tensor], max_new_tokens: int
    ) -> tuple[list[str], list[bool]]:
        """Greedy generation (KV cache on) of at most ``max_new_tokens`` tokens per sample.
        Returns the decoded answers (special tokens dropped) and whether each stopped at the
        end-of-turn token rather than at the token limit."""
        tok = self._tokenizer
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        out = self._model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            use_cache=True,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        new = out[:, batch["input_ids"].shape[1] :].cpu()
        stopped = [bool((row == eos).any()) for row in new]
        return tok.batch_decode(new, skip_special_tokens=True), stopped

    # -- scoring skeleton ------------------------------------------------------------------
    def _chunked(
        self, n: int, call: ChunkCall
    ) -> tuple[Tensor, list[str | None], dict[str, float]]:
        """Run ``call(start, stop) -> (values[b], errors[b], extras {name: Tensor[b]})`` over
        chunks of ``batch_size`` under ``no_grad``; extras become metrics ``<name>/<key>``
        (mean over the samples without an error)."""
        self._ensure_ready()
        values: list[Tensor] = []
        errors: list[str | None] = []
        extras: dict[str, list[Tensor]] = {}
        with torch.no_grad():
            for start in range(0, n, self.batch_size):
                stop = min(start + self.batch_size, n)
                v, e, x = call(start, stop)
                values.append(v.detach().to(device="cpu", dtype=torch.float64).reshape(-1))
                errors += e
                for key, t in x.items():
                    extras.setdefault(key, []).append(
                        t.detach().to("cpu", torch.float64).reshape(-1)
                    )
        ok = torch.tensor([e is None for e in errors], dtype=torch.bool)
        metrics: dict[str, float] = {}
        for key, parts in extras.items():
            both = torch.cat(parts)
            keep = ok & torch.isfinite(both)
            metrics[f"{self.name}/{key}"] = (
                float(both[keep].mean()) if bool(keep.any()) else float("nan")
            )
        joined = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
        return joined, errors, metrics

    def _finish(
        self, values: Tensor, errors: list[str | None], metrics: dict[str, float]
    ) -> ScoreResult:
        """``ScoreResult`` of one component: non-finite values without an error get one."""
        owner = type(self).__name__
        values = values.to(device="cpu", dtype=torch.float32).reshape(-1)
        finite = torch.isfinite(values).tolist()
        errors = [
            err
            if err is not None or ok
            else f"{owner} returned a non-finite score (dtype={self.dtype})"
            for err, ok in zip(errors, finite, strict=True)
        ]
        values = torch.where(torch.tensor([e is None for e in errors]), values, torch.nan)
        metrics = {**metrics, f"{self.name}/nonfinite": float(len(finite) - sum(finite))}
        return ScoreResult(scores={self.name: values}, errors={self.name: errors}, metrics=metrics)


def image_chat(text: str, *, before: int = 1, system: str | None = None) -> list[ChatTurn]:
    """One user turn: ``before`` image placeholders, then ``text`` (optional system turn)."""
    content: list[ChatPart] = [{"type": "image"} for _ in range(before)]
    content.append({"type": "text", "text": text})
    chat: list[ChatTurn] = []
    if system is not None:
        chat.append({"role": "system", "content": [{"type": "text", "text": system}]})
    chat.append({"role": "user", "content": content})
    return chat


def video_chat(text: str) -> list[ChatTurn]:
    """One user turn: the video placeholder, then ``text``."""
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]
