"""``FlowMatchingBundle``: the half of every family bundle that is not the family's own.

A bundle holds one family's modules (trainable transformer(s), frozen text encoders and VAE)
and supplies what the shared denoise loop and the driver need. This base owns the generic
part: the typed config taken whole (:class:`FlowMatchingBundleConfig` subclasses), device and
dtype parsing, freezing, offload / onload, the attention-kernel and autocast contexts, prompt
dedupe with a cached negative prompt, chunked decode, the σ policy hand-off, and the checks
the validators run before Ray (``check_config``, ``trainable_on_meta``). A family subclass
sets ``config_class`` and implements the hooks marked *family* below; its constructor is
derived from the config's fields, so ``SD3Bundle(path="tiny", dtype="fp32")`` and a recipe
block ``{_target_: unirl.models.sd3.SD3Bundle, path: ..., dtype: ...}`` both work, and a
misspelt key is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeAlias

import torch

from unirl.config.precision import canonical_precision, parse_dtype
from unirl.config.require import ConfigError, require
from unirl.config.typecheck import PositiveInt
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.cuda_graph import GraphedFunction
from unirl.models.common.engine_maps import EngineMaps
from unirl.models.common.fp8_linear import fp8_device_problem, fp8_sampling
from unirl.models.common.guidance import BatchedCFG, Guidance
from unirl.models.common.presets import ModelSourceError
from unirl.sde.schedule import sigmas_from_scheduler_config
from unirl.types import Conditions, DiffusionSamplingParams

if TYPE_CHECKING:
    from unirl.models.common.geometry import VideoGrid
    from unirl.models.common.sequence_parallel import SequenceParallel, SequenceParallelHandle

Architecture: TypeAlias = tuple[ConfigDict, ConfigDict]
"""``(transformer config, VAE config)`` of a model source, read without weights."""

SDPA_BACKENDS = ("auto", "torch", "flash", "efficient", "cudnn", "math")


@dataclasses.dataclass(kw_only=True)
class FlowMatchingBundleConfig:
    """The fields every family's ``bundle:`` block has.

    ``path``: ``tiny`` | an ``*-arch`` preset | a local diffusers folder | a hub id.
    ``dtype`` is the trainable transformer's precision; ``text_encoder_dtype`` and
    ``vae_dtype`` are the frozen parts'. ``device``: ``auto`` (the current CUDA device if
    there is one, else CPU), ``cpu``, ``cuda``, ``cuda:N``. ``negative_prompt`` is the
    default negative text. ``sdpa_backend`` picks the attention kernel on CUDA: ``auto``
    puts cuDNN's fused attention first on Hopper and newer (then flash, memory-efficient,
    math), for the whole worker process from the moment the bundle is built, and leaves older
    cards to PyTorch; ``torch`` is PyTorch's own order; ``flash`` / ``efficient`` / ``cudnn``
    / ``math`` pin one kernel around each transformer call (torch's switch is process-wide:
    a reward model scoring under ``rollout.reward_overlap`` meanwhile sees it too, so its
    scores can differ from end-of-rollout scoring at rounding level). CPU always uses
    PyTorch's choice.
    ``gradient_checkpointing`` recomputes the trainable module's activations in the backward
    (diffusers' ``enable_gradient_checkpointing``).
    ``decode_chunk_size`` bounds how many latents one VAE decode call takes; ``compile_vae``
    compiles the VAE decoder with ``torch.compile`` (one graph per chunk shape).
    ``fp8_sampling`` runs the frozen base's linear layers in float8 (e4m3, rowwise scales) in
    rollout sampling only (``common/fp8_linear.py``); training and the π_old replay stay in
    ``dtype``. CUDA needs compute capability 8.9 or newer. At SD3.5-Medium's 512² shapes it
    measured slower than bf16 on an H200 (docs/performance.md), so it is off by default.
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny",)

    path: str = "tiny"
    dtype: str = "bf16"
    text_encoder_dtype: str = "bf16"
    vae_dtype: str = "fp32"
    device: str = "auto"
    negative_prompt: str = ""
    gradient_checkpointing: bool = False
    sdpa_backend: str = "auto"
    decode_chunk_size: PositiveInt = 8
    compile_vae: bool = False
    fp8_sampling: bool = False

    def __post_init__(self) -> None:
        require(
            isinstance(self.path, str) and self.path.strip() != "",
            f"bundle.path must name a preset ({', '.join(self.preset_names)}), a local folder "
            "or a hub id",
        )
        self.dtype = canonical_precision(self.dtype, "bundle.dtype")
        self.text_encoder_dtype = canonical_precision(
            self.text_encoder_dtype, "bundle.text_encoder_dtype"
        )
        self.vae_dtype = canonical_precision(self.vae_dtype, "bundle.vae_dtype")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                require(
                    False,
                    f"bundle.device={self.device!r} is not a device ({exc}); use auto, cpu, cuda or cuda:N",
                )
        require(
            self.sdpa_backend in SDPA_BACKENDS,
            f"bundle.sdpa_backend={self.sdpa_backend!r} must be one of {SDPA_BACKENDS}",
        )
        require(
            self.decode_chunk_size >= 1,
            f"bundle.decode_chunk_size={self.decode_chunk_size} must be >= 1",
        )

    def resolved_device(self) -> torch.device:
        """``device`` as a ``torch.device``; ``auto`` picks the current CUDA device or CPU."""
        if self.device == "auto":
            return (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
        return torch.device(self.device)


_PROCESS_SDPA_ORDER: list[contextlib.AbstractContextManager[None]] = []


def sdpa_context(backend: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The attention kernel choice for one transformer call (see ``FlowMatchingBundleConfig``).

    ``auto`` on Hopper sets torch's kernel priority once for the whole process (the bundle
    calls this when it is built) and returns a no-op. Torch keeps that setting process-wide,
    not per thread, so a per-call switch would change the kernels of whatever another thread
    runs meanwhile (a reward model scoring a chunk under ``rollout.reward_overlap``) with the
    timing. Set once, every model in the worker sees the same order whether it runs during
    sampling or after it."""
    if backend == "torch" or device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "auto":
        if torch.cuda.get_device_capability(device) < (9, 0):
            return contextlib.nullcontext()
        if not _PROCESS_SDPA_ORDER:
            # Hopper: cuDNN's fused attention first (1.3-1.5x flash at SD3.5-M shapes, see
            # docs/performance.md); each backend still falls through when it cannot take the
            # inputs. Entered once and kept for the life of the process.
            order = [
                SDPBackend.CUDNN_ATTENTION,
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.MATH,
            ]
            kept = sdpa_kernel(order, set_priority=True)
            kept.__enter__()
            _PROCESS_SDPA_ORDER.append(kept)
        return contextlib.nullcontext()
    kernel = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    return sdpa_kernel(kernel)


def unique_with_index(texts: Sequence[str]) -> tuple[list[str], torch.Tensor]:
    """``(unique texts in first-seen order, index[N])`` with ``texts[i] == unique[index[i]]``."""
    position: dict[str, int] = {}
    index = [position.setdefault(t, len(position)) for t in texts]
    return list(position), torch.tensor(index, dtype=torch.long)


def require_size_multiple(key: str, size: int, multiple: int, why: str) -> None:
    """``sampling.<key>`` must be a multiple of ``multiple`` (the message names the two
    nearest valid sizes and ``why``)."""
    require(
        size % multiple == 0,
        f"sampling.{key}={size} is not a multiple of {multiple} ({why}); use "
        f"{max(multiple, size // multiple * multiple)} or {(size // multiple + 1) * multiple}",
    )


def _config_constructor(config_class: type) -> Callable[..., None]:
    """An ``__init__(self, **fields)`` whose signature and annotations are the config's
    fields (keyword-only, with their defaults): what ``inspect``, Hydra and the recipe
    validators read, so the fields are declared once, in the config dataclass."""

    def __init__(self: FlowMatchingBundle, **fields: object) -> None:
        self._setup(config_class(**fields))

    hints = typing.get_type_hints(config_class, include_extras=True)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for f in dataclasses.fields(config_class):
        if not f.init:
            continue
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (
                f.default_factory()
                if f.default_factory is not dataclasses.MISSING
                else inspect.Parameter.empty
            )
        )
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name]
            )
        )
    __init__.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    __init__.__annotations__ = {p.name: p.annotation for p in params[1:]} | {"return": None}
    __init__.__doc__ = f"Build from the fields of :class:`{config_class.__name__}`."
    return __init__


class FlowMatchingBundle:
    """A family's modules and the generic half of its contract (see the module docstring).

    Family hooks: :meth:`load` (build or load the modules and read the geometry),
    :meth:`encode_unique`, :meth:`with_negative`, :meth:`predict_velocity`,
    :meth:`latent_shape`, :meth:`image_seq_len`, :meth:`decode_chunk`, and the classmethods
    :meth:`architecture`, :meth:`check_image_size` and :meth:`trainable_from_architecture`.
    The trainable module(s) are attributes named in ``trainable_module_names``; wrappers
    (peft, FSDP) may replace them and every method goes through the attribute.
    ``engine_maps`` (an :class:`EngineMaps`) is how the family's data crosses the external
    engines; a family without one cannot sample through SGLang or vLLM-Omni.
    """

    config_class: ClassVar[type[FlowMatchingBundleConfig]] = FlowMatchingBundleConfig
    guidance: ClassVar[Guidance] = BatchedCFG()
    trainable_module_names: ClassVar[tuple[str, ...]] = ("transformer",)
    frozen_module_names: ClassVar[tuple[str, ...]] = ()
    block_class_names: ClassVar[tuple[str, ...]] = ()
    # how its blocks compile under ``backend.fsdp.compile_dynamic=family`` (torch.compile's
    # ``dynamic``): True where the joint sequence length follows each prompt's text length
    compile_dynamic: ClassVar[bool | None] = False
    lora_default_targets: ClassVar[tuple[str, ...]] = ()
    # the family's dialect on SGLang / vLLM-Omni (``engine_maps.py`` of the family package);
    # None: the external engines refuse the family (``engine_maps_for``)
    engine_maps: ClassVar[EngineMaps | None] = None
    # True for editing families: ``encode_references`` attaches reference images
    takes_references: ClassVar[bool] = False

    config: FlowMatchingBundleConfig
    scheduler_config: ConfigDict
    vae: Any  # every family decodes through a VAE (``compile_vae`` compiles its decoder)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__ and "__init__" not in cls.__dict__:
            cls.__init__ = _config_constructor(cls.config_class)  # type: ignore[method-assign]

    def __init__(self, **fields: Any) -> None:  # the config's fields, each of its own type
        self._setup(self.config_class(**fields))

    @classmethod
    def from_config(cls, config: FlowMatchingBundleConfig) -> Self:
        """The bundle of a typed config, taken whole."""
        if not isinstance(config, cls.config_class):
            raise TypeError(
                f"{cls.__name__}.from_config takes a {cls.config_class.__name__}, got "
                f"{type(config).__name__}"
            )
        bundle = cls.__new__(cls)
        bundle._setup(config)
        return bundle

    def _setup(self, config: FlowMatchingBundleConfig) -> None:
        self.config = config
        self.device = config.resolved_device()
        self.dtype = parse_dtype(config.dtype, "bundle.dtype")
        self.text_encoder_dtype = parse_dtype(
            config.text_encoder_dtype, "bundle.text_encoder_dtype"
        )
        self.vae_dtype = parse_dtype(config.vae_dtype, "bundle.vae_dtype")
        if config.fp8_sampling:  # before any weight is read
            problem = fp8_device_problem(self.device)
            require(problem is None, f"bundle.fp8_sampling=true: {problem}; set it to false")
        self._negative_cache: dict[str, Conditions] = {}
        self._graphs: dict[str, GraphedFunction] = {}
        self._offloaded = False
        self.load()
        for module in self._frozen_modules():
            module.requires_grad_(False).eval()
        for module in self.trainable_modules.values():
            module.eval()
            if config.gradient_checkpointing:
                module.enable_gradient_checkpointing()
        self.to(self.device)
        if config.compile_vae:  # compiled lazily on the first decode, one graph per chunk shape
            self.vae.decoder.compile(dynamic=False)
        # ``auto`` sets the process's attention order here, before any text encoder or reward
        # model runs, so the first rollout runs the same kernels as the later ones (and a
        # resumed run as the run it continues)
        self.sdpa_context()

    # -- family hooks ---------------------------------------------------------------------

    def load(self) -> None:
        """*Family*: build or load the modules from ``self.config`` (on CPU or the device)
        and set them as attributes, with ``scheduler_config`` and the geometry."""
        raise NotImplementedError

    def encode_unique(self, texts: list[str]) -> Conditions:
        """*Family*: conditions of ``texts`` (unique), one row each, on the bundle's device."""
        raise NotImplementedError

    def with_negative(self, conditions: Conditions, negative: Conditions) -> Conditions:
        """*Family*: ``conditions`` with the one-row ``negative`` attached to every row."""
        raise NotImplementedError

    def encode_references(self, conditions: Conditions, pixels: torch.Tensor) -> Conditions:
        """*Family* (editing families only): ``conditions`` with one reference image per row
        attached, ``pixels[N, 3, H, W]`` float32 in [0, 1] (row ``i`` conditions sample ``i``,
        negative rows included). Families without reference conditioning keep this default,
        which refuses the request."""
        raise ValueError(
            f"{type(self).__name__} takes no reference images, but the prompts carry "
            "'media' references (an editing dataset); use an editing family such as "
            "unirl.models.flux2.Flux2KleinBundle, or a prompt file without 'media'"
        )

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor | float, conditions: Any
    ) -> torch.Tensor:
        """*Family*: fp32 ``v`` with the shape of ``latents[B, ...]`` at ``sigma[B]``."""
        raise NotImplementedError

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """*Family*: the per-sample latent of a ``height x width`` image."""
        raise NotImplementedError

    def image_seq_len(self, height: int, width: int) -> int:
        """*Family*: image tokens the transformer sees (for resolution-dependent σ shifts)."""
        raise NotImplementedError

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """*Family*: ``pixels[B, 3, H, W]`` float32 in [0, 1] for one chunk of latents."""
        raise NotImplementedError

    def recompile_hint(self) -> str | None:
        """*Family*: the knob of this bundle that stops its compiled blocks from recompiling
        in later rollouts, for the warning of ``train.compile_watch`` (None: no such knob)."""
        return None

    @classmethod
    def architecture(cls, path: str) -> Architecture | None:
        """*Family*: the configs of the model at ``path``, read without weights (None when
        not readable here, e.g. an uncached hub id); raises ``ModelSourceError``."""
        return None

    @classmethod
    def check_image_size(cls, architecture: Architecture, key: str, size: int) -> None:
        """*Family*: refuse ``sampling.<key>=size`` this architecture cannot take."""

    @classmethod
    def trainable_from_architecture(cls, architecture: Architecture) -> torch.nn.Module | None:
        """*Family*: the trainable module built from ``architecture`` (called on meta)."""
        return None

    @classmethod
    def video_grid(cls, architecture: Architecture) -> VideoGrid | None:
        """*Video family*: the token grid of ``architecture`` (VAE compression, patches), from
        configs only; None: not a video family."""
        return None

    # -- checks before anything is built (dry_run and the driver's validators) -------------

    @classmethod
    def _path_of(cls, block: Mapping[str, object]) -> str:
        default = cls.config_class.__dataclass_fields__["path"].default
        return str(block.get("path", default))

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """Refuse a model path that resolves to nothing and image sizes this architecture
        cannot take, reading configs only (no weights, no download)."""
        try:
            architecture = cls.architecture(cls._path_of(block))
        except ModelSourceError as exc:
            raise ConfigError(f"bundle.path: {exc}") from exc
        sampling = getattr(recipe, "sampling", None) or {}
        if architecture is None or not isinstance(sampling, dict):
            return
        for key in ("height", "width"):
            size = sampling.get(key)
            if isinstance(size, int) and not isinstance(size, bool):
                cls.check_image_size(architecture, key, size)

    @classmethod
    def trainable_on_meta(cls, block: Mapping[str, object]) -> torch.nn.Module | None:
        """The trainable module built on the meta device from its config (module names for
        LoRA target checks, no memory); None when the config is not readable here."""
        try:
            architecture = cls.architecture(cls._path_of(block))
        except ModelSourceError:
            return None
        if architecture is None:
            return None
        with torch.device("meta"):
            return cls.trainable_from_architecture(architecture)

    @classmethod
    def video_tokens_of(
        cls, block: Mapping[str, object], height: int, width: int, frames: int
    ) -> int | None:
        """The transformer's video tokens per sample of the recipe's model at this geometry
        (what sequence parallelism splits; configs only); None when the config is not
        readable here or the family is not a video one."""
        try:
            architecture = cls.architecture(cls._path_of(block))
        except ModelSourceError:
            return None
        grid = None if architecture is None else cls.video_grid(architecture)
        return None if grid is None else grid.tokens(height, width, frames)

    # -- modules ----------------------------------------------------------------------------

    @property
    def trainable_modules(self) -> dict[str, torch.nn.Module]:
        return {name: getattr(self, name) for name in self.trainable_module_names}

    def enable_sequence_parallel(self, sp: SequenceParallel) -> list[SequenceParallelHandle]:
        """Ulysses sequence parallelism over the SP group ``sp`` (a
        ``common.sequence_parallel.SequenceParallel``) in every trainable module: each still
        takes and returns whole tensors, so sampling, replay and the loss are unchanged. The
        returned handles' ``remove()`` switches it off."""
        from unirl.models.common.sequence_parallel import enable_sequence_parallel

        return [enable_sequence_parallel(m, sp) for m in self.trainable_modules.values()]

    @property
    def trainable_module(self) -> torch.nn.Module:
        """The (first) trainable module, what ``FSDPBackend`` wraps."""
        return getattr(self, self.trainable_module_names[0])

    def postprocess_lora_export(self, folder: Path) -> None:
        """*Family* (optional): reshape a LoRA export the backend just wrote to ``folder`` into
        what the family's diffusers pipeline loads (Wan 2.2 with both experts: one folder per
        expert). Runs on the writing rank only. The default keeps the export as written."""

    def _frozen_modules(self) -> list[torch.nn.Module]:
        modules = (getattr(self, name, None) for name in self.frozen_module_names)
        return [m for m in modules if m is not None]

    def to(self, device: torch.device | str) -> Self:
        """Move every module to ``device`` (and make it the bundle's device)."""
        self.device = torch.device(device)
        for module in self.trainable_modules.values():
            module.to(self.device)
        for module in self._frozen_modules():
            module.to(self.device)
        self._negative_cache.clear()
        self._graphs.clear()
        self._offloaded = False
        return self

    def offload(self) -> None:
        """Park the frozen parts (text encoders, VAE) on CPU to free device memory."""
        self._graphs.clear()  # they hold the device addresses of the weights that move
        for module in self._frozen_modules():
            module.to("cpu")
        self._offloaded = True

    def onload(self) -> None:
        """Bring the frozen parts back to the bundle's device."""
        self._graphs.clear()
        for module in self._frozen_modules():
            module.to(self.device)
        self._offloaded = False

    def graphed(
        self, name: str, fn: Callable[..., tuple[torch.Tensor, ...]], switch: str
    ) -> GraphedFunction:
        """``fn`` replayed from CUDA graphs on the bundle's device (one per input signature),
        kept under ``name`` until the modules move (``to`` / ``offload`` / ``onload`` drop
        every graph). ``switch``: the recipe key that turns it off, for errors."""
        if name not in self._graphs:
            self._graphs[name] = GraphedFunction(fn, device=self.device, switch=switch)
        return self._graphs[name]

    def _require_onloaded(self, what: str) -> None:
        if self._offloaded:
            raise RuntimeError(
                f"{type(self).__name__}.{what}: the frozen modules are offloaded to CPU; call "
                "onload() first"
            )

    # -- contexts for the transformer call -------------------------------------------------------

    def sdpa_context(self) -> contextlib.AbstractContextManager[None]:
        return sdpa_context(self.config.sdpa_backend, self.device)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """On accelerators, autocast runs every matmul (the fp32 LoRA master weights included)
        in the bundle's dtype; on CPU, and in fp32, the math is exactly the module's own."""
        return torch.autocast(
            device_type=self.device.type,
            dtype=self.dtype,
            enabled=self.device.type == "cuda" and self.dtype != torch.float32,
        )

    def sampling_precision(self) -> contextlib.AbstractContextManager[object]:
        """Around a rollout's denoise loop: the frozen base's linears in FP8 with
        ``fp8_sampling`` (no-grad forwards only, ``fp8_linear.fp8_sampling``), else nothing."""
        if not self.config.fp8_sampling:
            return contextlib.nullcontext()
        return fp8_sampling(self.trainable_modules.values(), self.device)

    # -- encode -------------------------------------------------------------------------------

    def negative_conditions(self, negative_prompt: str | None = None) -> Conditions:
        """One row: ``negative_prompt`` (default: the config's) encoded once and cached."""
        self._require_onloaded("negative_conditions")
        text = self.config.negative_prompt if negative_prompt is None else negative_prompt
        if text not in self._negative_cache:
            self._negative_cache[text] = self.encode_unique([text])
        return self._negative_cache[text]

    def encode_prompts(
        self,
        texts: list[str],
        *,
        negative: bool = False,
        negative_prompt: str | None = None,
        samples_per_prompt: int = 1,
    ) -> Conditions:
        """Conditions with ``len(texts) * samples_per_prompt`` rows (each text repeated in place).

        Each unique text is encoded once and its row shared by every copy, so a group's
        samples see bit-identical embeddings. With ``negative=True`` (or a ``negative_prompt``)
        the negative rows hold the cached encoding of ``negative_prompt`` (default: the
        config's, usually ``""``), broadcast to every row.
        """
        name = type(self).__name__
        self._require_onloaded("encode_prompts")
        if isinstance(texts, str):
            raise TypeError(f"{name}.encode_prompts takes a list of texts, not a single string")
        if not texts:
            raise ValueError(f"{name}.encode_prompts: empty list of texts")
        if samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt={samples_per_prompt} must be >= 1")
        unique, index = unique_with_index(list(texts))
        conditions = self.encode_unique(unique).select(index.repeat_interleave(samples_per_prompt))
        if negative or negative_prompt is not None:
            conditions = self.with_negative(conditions, self.negative_conditions(negative_prompt))
        return conditions

    # -- σ policy, geometry and decode -----------------------------------------------------------

    def latent_shape_for(self, params: DiffusionSamplingParams) -> tuple[int, ...]:
        """The latent of a request's sampling params (``height``, ``width``; a video family
        also reads ``num_frames``)."""
        return self.latent_shape(int(params.height), int(params.width))

    def sigmas(self, num_inference_steps: int, height: int, width: int) -> torch.Tensor:
        """``sigmas[T + 1]``: the schedule the family's diffusers pipeline would use for this
        many steps at this resolution (``unirl.sde.sigmas_from_scheduler_config``)."""
        return sigmas_from_scheduler_config(
            self.scheduler_config,
            num_inference_steps,
            image_seq_len=self.image_seq_len(height, width),
        )

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``pixels[B, 3, H, W]`` float32 in [0, 1] from model-space ``latents``, decoded
        ``decode_chunk_size`` latents per VAE call. Respects the caller's grad mode."""
        self._require_onloaded("decode")
        chunk = self.config.decode_chunk_size
        return torch.cat(
            [self.decode_chunk(latents[i : i + chunk]) for i in range(0, latents.shape[0], chunk)]
        )
