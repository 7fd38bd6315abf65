"""Request and response bodies (pydantic), which also define the published OpenAPI schema."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Frames = Annotated[list[str], Field(min_length=1)]


class ScoreRequest(BaseModel):
    """Score ``N`` samples with one reward (``reward``) or several (``rewards``).

    Give exactly one of ``images`` (base64 PNG or JPEG, one per sample) and ``videos`` (per
    sample a list of base64 PNG/JPEG frames, or one base64 mp4 string). ``prompts`` and
    ``metadata`` default to ``""`` and ``{}`` per sample; when given they need ``N`` entries.
    Edits add ``sources`` (with ``images`` only): the image each result was edited from,
    one per image; edit rewards compare the two, other rewards ignore them. Videos need
    ``fps`` (their frame rate); every video's frames share one size, and a video reaches the
    reward whole (``score_video(frames[n, T, 3, H, W], fps, ...)``).
    """

    model_config = ConfigDict(extra="forbid")

    reward: str | None = Field(default=None, description="One reward name (see GET /rewards).")
    rewards: list[str] | None = Field(
        default=None, min_length=1, description="Several reward names, scored independently."
    )
    images: list[str] | None = Field(
        default=None, min_length=1, description="Base64 PNG or JPEG, one per sample."
    )
    videos: list[Frames | str] | None = Field(
        default=None,
        min_length=1,
        description="Per sample a list of base64 PNG/JPEG frames, or a base64 mp4 string.",
    )
    sources: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Edits: base64 PNG or JPEG of the image each result was edited from, one "
        "per image (with 'images' only). Rewards that compare result and source need them.",
    )
    fps: float | None = Field(
        default=None,
        gt=0,
        description="Frames per second of the videos (required with 'videos', one rate for "
        "the request); passed to the rewards' score_video.",
    )
    prompts: list[str] | None = Field(default=None, description="One prompt per sample.")
    metadata: list[dict[str, Any]] | None = Field(
        default=None, description="One JSON object per sample (e.g. target_text for OCR)."
    )


class SampleScore(BaseModel):
    """One sample's result for one reward.

    ``score`` is the reward's scalar (the total of a combining backend, else its single
    component); it is ``null`` when the sample failed (then ``error`` says why) and for
    rewards with several components and no total (read ``components``). ``error`` may also
    accompany a finite score when the scorer reported a problem (e.g. an OCR engine failure
    scored 0). ``component_errors`` holds the errors of failed or flagged components only.
    """

    score: float | None
    error: str | None
    components: dict[str, float | None]
    component_errors: dict[str, str] = Field(default_factory=dict)


class RewardResult(BaseModel):
    """One reward's results for every sample of the request, in request order."""

    components: list[str]
    has_total: bool
    samples: list[SampleScore]
    metrics: dict[str, float] = Field(
        description="Request-level counters: failures, timeouts, <component>/failures."
    )
    elapsed_s: float


class ScoreResponse(BaseModel):
    kind: Literal["images", "videos"]
    num_samples: int
    results: dict[str, RewardResult]


class RewardInfo(BaseModel):
    name: str
    target: str = Field(description="The scorer's _target_ class path.")
    components: list[str]
    has_total: bool
    scalar: bool = Field(description="Whether SampleScore.score is filled for this reward.")
    replicas: int
    timeout_s: float
    max_batch_size: int = Field(description="Most images (or videos) one scorer call receives.")
    device: str
    needs_sources: bool = Field(
        default=False,
        description="Whether the reward compares each image with its source: a request "
        "without 'sources' gets a per-sample error from it.",
    )
    scores_videos: bool = Field(
        default=False,
        description="Whether the reward scores whole videos (score_video: a video reward, or "
        "an image reward wrapped in unirl.reward.local.PerFrame); an image-only reward answers "
        "'videos' with a per-sample error.",
    )


class Limits(BaseModel):
    max_request_bytes: int
    max_batch_size: int = Field(description="Most samples (images or videos) per request.")
    max_frames: int
    max_image_pixels: int = Field(description="Most H*W of one image or frame.")
    max_sample_pixels: int = Field(description="Most frames*H*W of one sample (a video).")
    max_request_pixels: int = Field(description="Most decoded pixels of one request.")


class RewardsResponse(BaseModel):
    rewards: list[RewardInfo]
    limits: Limits
    auth: bool = Field(description="Whether a bearer token is required.")


class PoolState(BaseModel):
    replicas: int = Field(description="Live worker threads.")
    busy: int = Field(description="Replicas scoring right now.")
    abandoned: int = Field(description="Timed-out calls still running in the background.")
    queued_jobs: int
    queued_samples: int
    scored_samples: int
    failed_samples: int
    timeouts: int
    batches: int


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded"] = Field(
        description="degraded while a pool has no live replica or abandoned calls running."
    )
    uptime_s: float
    rewards: dict[str, PoolState] | None = Field(
        description="Per-reward pools; null without the bearer token when auth is on."
    )


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """Every 4xx answer: ``detail`` says what was wrong and how to fix it."""

    detail: str
    errors: list[FieldError] = Field(
        default_factory=list, description="Per-field errors of a body that failed validation."
    )
