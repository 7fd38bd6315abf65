"""EditJudge: a vision-language model rates an edit (EditReward / VIEScore style).

The model (Qwen2.5-VL, Qwen2-VL or another ``AutoModelForImageTextToText`` whose template
renders ``{"type": "image"}`` as one image-token placeholder) is shown the source image, the
edited image and the instruction, and asked for a rating in ``[min_rating, max_rating]``. The
score is the expected rating under the model's next-token distribution restricted to the
rating tokens and renormalised, optionally mapped to ``[0, 1]``; nothing is sampled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import (
    EditRewardBackend,
    RewardError,
    ScoreResult,
    check_images,
    check_lengths,
    images_to_uint8,
)
from unirl.reward.local.vlm.engine import ChatPart, ChatTurn, QwenVLScorer

DEFAULT_QUESTION = (
    "The first image is the source; the second is the source edited by the instruction: "
    '"{instruction}". Rate how well the edit follows the instruction while keeping the rest of '
    "the source unchanged, from {low} (not done at all) to {high} (perfect). "
    "Answer with the number only."
)
SOURCE_LABEL = "Source image:"
RESULT_LABEL = "Edited image:"
_DIGITS = frozenset("0123456789")

Node = tuple[int, ...]


def judge_messages(instruction: str, question: str, low: int, high: int) -> list[ChatTurn]:
    """The chat shown to the judge: one user turn with the source image, the edited image
    and ``question`` formatted with the instruction and the rating range."""
    text = question.format(instruction=instruction, low=low, high=high)
    content: list[ChatPart] = [
        {"type": "text", "text": SOURCE_LABEL},
        {"type": "image"},
        {"type": "text", "text": RESULT_LABEL},
        {"type": "image"},
        {"type": "text", "text": text},
    ]
    return [{"role": "user", "content": content}]


@dataclass(frozen=True)
class RatingReader:
    """Reads the expected rating off next-token probabilities, one token or several.

    Each rating ``r`` is the token sequence of ``str(r)``. With a tokenizer that writes every
    rating as one token (``paths == ((),)``), the rating distribution is the next-token
    distribution restricted to those tokens and renormalised. With one that splits numbers
    into digits (Qwen: ``10`` = ``1``, ``0``), ratings form a tree: a node is a token prefix,
    and at every node the allowed outcomes are the next tokens of in-range ratings plus, where
    the prefix is itself a rating, "the number ends" (the next token does not begin with a
    digit, ``1 - Σ_{t ∈ digit tokens} p(t)``). Each node's outcomes are renormalised, so
    ``p(1) ∝ p_root(1) · end(1) / (end(1) + p_1(0))`` and ``p(10) ∝ p_root(1) · p_1(0) / (...)``
    while out-of-range continuations (11-19) drop out. ``paths`` are the token sequences to
    append to the prompt so one forward pass per path sees every inner node.
    """

    ratings: tuple[int, ...]
    tokens: tuple[Node, ...]
    paths: tuple[Node, ...]
    children: dict[Node, tuple[int, ...]]
    digit_ids: Tensor | None  # token ids beginning with a digit; only when a rating is inner

    @classmethod
    def build(cls, ratings: list[int], tokens: list[Node], vocab: list[str] | None) -> RatingReader:
        """``tokens[i]`` are the ids of ``str(ratings[i])``; ``vocab`` (id -> text) is needed
        only when a rating's tokens are a prefix of another's (see :meth:`needs_vocab`)."""
        children: dict[Node, list[int]] = {}
        for seq in tokens:
            for j in range(len(seq)):
                kids = children.setdefault(seq[:j], [])
                if seq[j] not in kids:
                    kids.append(seq[j])
        inner = set(children)
        paths = tuple(
            sorted(n for n in inner if not any(o[: len(n)] == n and o != n for o in inner))
        )
        digit_ids = None
        if cls.needs_vocab(tokens):
            require(vocab is not None, "RatingReader: a rating is a prefix of another; give vocab")
            ids = [i for i, text in enumerate(vocab or []) if text[:1] in _DIGITS]
            digit_ids = torch.tensor(ids, dtype=torch.long)
        return cls(
            ratings=tuple(ratings),
            tokens=tuple(tokens),
            paths=paths,
            children={k: tuple(v) for k, v in children.items()},
            digit_ids=digit_ids,
        )

    @staticmethod
    def needs_vocab(tokens: list[Node]) -> bool:
        """True when some rating's token sequence is a proper prefix of another's."""
        return any(a != b and b[: len(a)] == a for a in tokens for b in tokens)

    def expectation(self, probs: dict[Node, Tensor]) -> tuple[Tensor, Tensor]:
        """``probs[node]`` = next-token probabilities ``[B, V]`` (float64) after the prompt
        plus ``node``. Returns ``(expected rating[B], mass[B])``; ``mass`` is the root's
        probability of beginning any rating (how much the model answers with a number)."""
        rating_nodes = set(self.tokens)
        norms: dict[Node, Tensor] = {}
        for node, kids in self.children.items():
            p = probs[node]
            norm = p[:, list(kids)].sum(-1)
            if node in rating_nodes:
                norm = norm + self._end(p)
            norms[node] = norm
        weights = []
        for seq in self.tokens:
            w = torch.ones_like(norms[()])
            for j, token in enumerate(seq):
                w = w * probs[seq[:j]][:, token] / norms[seq[:j]]
            if seq in self.children:  # also a prefix of a longer rating: the number ends here
                w = w * self._end(probs[seq]) / norms[seq]
            weights.append(w)
        stacked = torch.stack(weights, dim=-1)  # [B, R], rows sum to 1
        values = torch.tensor(self.ratings, dtype=stacked.dtype, device=stacked.device)
        mass = probs[()][:, list(self.children[()])].sum(-1)
        return stacked @ values, mass

    def _end(self, p: Tensor) -> Tensor:
        assert self.digit_ids is not None
        return (1.0 - p[:, self.digit_ids.to(p.device)].sum(-1)).clamp_min(0.0)


@dataclass(kw_only=True)
class EditJudge(QwenVLScorer, EditRewardBackend):
    """A VLM judge of edits. ``score_edit`` shows the model, per sample, the source, the
    result and the instruction (``prompts[i]``) in the folder's chat template
    (:func:`judge_messages`, then the generation prompt and ``answer_prefix``) and returns

        ``E[r] = Σ_r r · p(r)``, ``r ∈ [min_rating, max_rating]``,

    ``p`` the next-token probabilities of the rating tokens renormalised over the range
    (:class:`RatingReader`; multi-token ratings such as Qwen's ``1``, ``0`` handled exactly),
    mapped to ``(E[r] - min_rating) / (max_rating - min_rating)`` when ``unit_scale``.
    ``min_rating`` / ``max_rating``: the ends of the judge's integer rating scale.
    ``question``: the text after the two images, a format string with ``{instruction}`` (the
    edit request, required) and ``{low}`` / ``{high}`` (the rating scale's ends).

    ``path``: a hub id or a local folder holding the model, its tokenizer (with a chat
    template, or set ``chat_template``) and its image processor, loaded by the VLM rewards'
    engine (:class:`~unirl.reward.local.vlm.engine.QwenVLScorer`; batches padded on the left).
    ``max_pixels`` caps each image's pixels after the processor's resize (``None``: the
    folder's setting). Images are quantised to ``uint8`` before the processor, as a PIL image
    would be. Weights load on the first ``score_edit``; ``device``, ``dtype``, ``batch_size`` (pairs per forward),
    ``offload`` / ``onload`` as for the other model scorers. ``metrics``:
    ``<name>/rating_mass`` (mean probability of beginning a rating) and ``<name>/nonfinite``.
    """

    path: str = "Qwen/Qwen2.5-VL-7B-Instruct"
    name: str = "edit_judge"
    batch_size: int = 4
    min_rating: int = 1
    max_rating: int = 10
    unit_scale: bool = True
    question: str = DEFAULT_QUESTION
    answer_prefix: str = ""

    padding_side: ClassVar[str] = "left"

    _reader: Any = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("min_rating", "max_rating"):
            value = getattr(self, key)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                f"EditJudge.{key}={value!r}: use a non-negative integer",
            )
        require(
            self.min_rating < self.max_rating,
            f"EditJudge: min_rating={self.min_rating} must be below max_rating={self.max_rating}",
        )
        require(
            "{instruction}" in self.question,
            "EditJudge.question must contain '{instruction}' (where the edit instruction goes)",
        )
        try:
            self.question.format(instruction="x", low=self.min_rating, high=self.max_rating)
        except (KeyError, IndexError, ValueError) as exc:
            require(
                False,
                f"EditJudge.question is not a valid format string ({type(exc).__name__}: {exc}); "
                "use only {instruction}, {low}, {high} and write literal braces as {{ }}",
            )

    # -- loading ---------------------------------------------------------------------------
    def _after_load(self) -> None:
        self._reader = self._build_reader()

    def _build_reader(self) -> RatingReader:
        """Tokenise every rating after the prompt's real tail and refuse a tokenizer that
        would merge the rating with the text before it."""
        tail = self._render("x")[-1]
        encode = self._encode_text
        ratings = list(range(self.min_rating, self.max_rating + 1))
        tokens: list[Node] = []
        for rating in ratings:
            alone = tuple(encode(str(rating)))
            if not alone or encode(tail + str(rating)) != encode(tail) + list(alone):
                raise RewardError(
                    f"EditJudge: rating {rating} does not tokenise on its own after the prompt "
                    f"(answer_prefix={self.answer_prefix!r}); end answer_prefix with a character "
                    "the tokenizer never merges with digits (e.g. ': ' -> ':')"
                )
            tokens.append(alone)
        require(
            len(set(tokens)) == len(tokens),
            f"EditJudge: two ratings of [{self.min_rating}, {self.max_rating}] share tokens",
        )
        vocab = None
        if RatingReader.needs_vocab(tokens):
            size = len(self._tokenizer)
            vocab = self._tokenizer.batch_decode([[i] for i in range(size)])
        return RatingReader.build(ratings, tokens, vocab)

    # -- prompt ----------------------------------------------------------------------------
    def _render(self, instruction: str) -> list[str]:
        """The chat text split at the two image placeholders: ``[before, between, after]``,
        ``after`` ending with the generation prompt and ``answer_prefix``."""
        messages = judge_messages(instruction, self.question, self.min_rating, self.max_rating)
        image_token = self._pads["image"][1]
        pieces = str(self.render(messages) + self.answer_prefix).split(image_token)
        if len(pieces) != 3:
            raise RewardError(
                f"EditJudge: the chat template of {self.path!r} rendered {len(pieces) - 1} "
                f"'{image_token}' placeholders for 2 images (or the instruction "
                f"{instruction[:60]!r} contains one); set chat_template= to one that renders "
                '{"type": "image"} as one placeholder'
            )
        return pieces

    def _inputs(self, images: Tensor, sources: Tensor, prompts: list[str]) -> dict[str, Tensor]:
        """Left-padded ``input_ids[b, L]`` / ``attention_mask``, and the processor's
        ``pixel_values`` / ``image_grid_thw`` of source 0, result 0, source 1, ..."""
        for prompt in prompts:
            self._render(prompt)  # one placeholder per image, or a clear error
        results_u8, sources_u8 = images_to_uint8(images), images_to_uint8(sources)
        visuals = [
            [("image", s), ("image", r)] for s, r in zip(sources_u8, results_u8, strict=True)
        ]
        chats = [
            judge_messages(p, self.question, self.min_rating, self.max_rating) for p in prompts
        ]
        return self.build_batch(chats, visuals, suffix=self.answer_prefix)

    # -- scoring ---------------------------------------------------------------------------
    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        return EditRewardBackend.score(self, images, prompts, metadata)

    def _score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        # PretrainedScorer's per-image hook; a judge of pairs is driven by score_edit alone.
        raise TypeError("EditJudge scores (source, result) pairs: call score_edit")

    def score_edit(
        self, images: Tensor, sources: Tensor, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        """``images[N, 3, H, W]`` results and ``sources[N, 3, H', W']`` in [0, 1], ``prompts``
        the instructions. Returns ``score[N]`` float32 on CPU (NaN with an error where the
        model's probabilities are not finite)."""
        owner = type(self).__name__
        n = len(prompts)
        check_lengths(n, owner, metadata=metadata)
        images = check_images(images, n, owner)
        sources = check_images(sources, n, f"{owner} (sources)")
        self._ensure_ready()
        scores: list[Tensor] = []
        masses: list[Tensor] = []
        with torch.no_grad():
            for start in range(0, n, self.batch_size):
                stop = min(start + self.batch_size, n)
                expected, mass = self._judge(
                    images[start:stop], sources[start:stop], list(prompts[start:stop])
                )
                scores.append(expected)
                masses.append(mass)
        values = torch.cat(scores).to(torch.float32) if scores else torch.zeros(0)
        finite = torch.isfinite(values).tolist()
        errors: list[str | None] = [
            None if ok else f"{owner} got non-finite rating probabilities (dtype={self.dtype})"
            for ok in finite
        ]
        mass = torch.cat(masses) if masses else torch.zeros(0)
        return ScoreResult(
            scores={self.name: values},
            errors={self.name: errors},
            metrics={
                f"{self.name}/nonfinite": float(n - sum(finite)),
                f"{self.name}/rating_mass": float(mass.mean()) if n else math.nan,
            },
        )

    def _judge(self, images: Tensor, sources: Tensor, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """One chunk: ``(score[b], rating mass[b])`` float64 on CPU."""
        assert self._reader is not None
        inputs = self._inputs(images, sources, prompts)
        b = len(prompts)
        probs: dict[Node, Tensor] = {}
        for path in self._reader.paths:
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            if path:
                tail = torch.tensor(path, dtype=ids.dtype, device=ids.device).expand(b, -1)
                ids = torch.cat([ids, tail], dim=1)
                mask = torch.cat([mask, torch.ones_like(tail)], dim=1)
            logits = self._model(
                input_ids=ids,
                attention_mask=mask,
                pixel_values=inputs["pixel_values"],
                image_grid_thw=inputs["image_grid_thw"],
                logits_to_keep=len(path) + 1,
            ).logits
            # position j holds the distribution after the prompt plus path[:j]
            step = torch.softmax(logits[:, -(len(path) + 1) :].double(), dim=-1).cpu()
            for j in range(len(path) + 1):
                probs.setdefault(path[:j], step[:, j])
        expected, mass = self._reader.expectation(probs)
        if self.unit_scale:
            expected = (expected - self.min_rating) / (self.max_rating - self.min_rating)
        return expected, mass
