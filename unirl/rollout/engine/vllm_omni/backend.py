"""The in-process vLLM-Omni diffusion engine behind ``VllmOmniEngine``.

Written against vLLM-Omni's public Python entry point as published (``Omni(model=...)``,
``Omni.generate(prompts, OmniDiffusionSamplingParams(...))`` with pinned ``latents`` and
``return_trajectory_latents``). The outputs are ``OmniRequestOutput`` objects (``images``: PIL
images; ``trajectory_latents`` / ``trajectory_timesteps`` / ``trajectory_log_probs``), checked
against what vLLM-Omni 0.30.0's SD3 pipeline and output assembly return
(``tests/rollout/test_vllm_omni_released_generate.py``): that release fills no trajectory for
SD3 (only Bagel's pipeline records one), which this backend refuses in one line. Weight updates go through vLLM-Omni's ``collective_rpc`` (the sync
``Omni`` has it on ``Omni.engine``) to the methods of unirl's worker extension
(``worker_ext.UnirlWorkerExtension``, passed as ``worker_extension_cls`` unless
``omni_kwargs`` names another) and to the workers' own ``sleep`` / ``wake_up``; that path is
tested against vLLM-Omni 0.30.0's released wrapper and executor code
(``tests/fixtures/engines/record_vllm_omni.py``).
Video families: each entry of ``images`` is assumed to be one sample's frames (the adapter
reads it as ``[T, H, W, 3]`` or ``[T, 3, H, W]``; see ``video.py``).
Each assumption fails with a message naming it rather than guessing further.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.rollout.engine.dedicated.trajectory import EngineContractError

EXTRA_HINT = "pip install 'unirl-mm[vllm]'"
WORKER_EXTENSION = "unirl.rollout.engine.vllm_omni.worker_ext.UnirlWorkerExtension"


def require_vllm_omni() -> Any:
    try:
        import vllm_omni
        from vllm_omni.entrypoints.omni import Omni  # noqa: F401
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the vllm_omni rollout engine needs vLLM-Omni's diffusion engine: {EXTRA_HINT} (import failed: {exc})"
        ) from exc
    return vllm_omni


class OmniBackend:
    """``generate(prompt, params) -> [per-sample dict]`` and weight calls on one ``Omni``."""

    def __init__(
        self,
        *,
        model_path: str,
        omni_kwargs: dict[str, Any] | None = None,
        log_prob_attr: str = "trajectory_log_probs",
    ) -> None:
        require_vllm_omni()
        from vllm_omni.entrypoints.omni import Omni

        kwargs = {"worker_extension_cls": WORKER_EXTENSION, **(omni_kwargs or {})}
        self.omni = Omni(model=model_path, **kwargs)
        self.log_prob_attr = log_prob_attr

    def generate(self, prompt: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        outputs = self.omni.generate(prompt, OmniDiffusionSamplingParams(**params))
        samples: list[dict[str, Any]] = []
        for out in outputs if isinstance(outputs, list | tuple) else [outputs]:
            images = getattr(out, "images", None)
            traj = getattr(out, "trajectory_latents", None)
            if not images:
                raise EngineContractError(
                    f"vllm_omni: {type(out).__name__} has no images "
                    f"(final_output_type={getattr(out, 'final_output_type', None)!r}, error="
                    f"{getattr(out, 'error', None)!r}); the adapter maps image / video outputs only"
                )
            if traj is None:
                raise EngineContractError(
                    f"vllm_omni: {type(out).__name__} has no trajectory_latents although "
                    "return_trajectory_latents=True was sent: this model's vLLM-Omni pipeline does "
                    "not record the denoising trajectory (in vLLM-Omni 0.30.0 only Bagel's does), "
                    "so no LatentSegment can be built; sample it with the trainside, dedicated or "
                    "sglang engine"
                )
            if torch.as_tensor(traj).shape[:1] != (len(images),):
                raise EngineContractError(
                    f"vllm_omni: trajectory_latents of shape {list(torch.as_tensor(traj).shape)} "
                    f"is not batch-first over the output's {len(images)} image(s)"
                )
            logp = getattr(out, self.log_prob_attr, None)
            timesteps = getattr(out, "trajectory_timesteps", None)
            for i, image in enumerate(images):
                samples.append(
                    {
                        "image": _to_tensor(image),
                        "trajectory_latents": torch.as_tensor(traj[i]),
                        "trajectory_timesteps": None
                        if timesteps is None
                        else torch.as_tensor(timesteps),
                        "log_probs": None if logp is None else torch.as_tensor(logp[i]),
                    }
                )
        return samples

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every diffusion worker: ``AsyncOmni`` answers
        ``collective_rpc`` itself, the synchronous ``Omni`` (0.30) through its ``engine``."""
        return rpc_results(self.omni, method, args)

    def update_weights(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        *,
        kind: str,
        lora_config: dict[str, Any] | None,
    ) -> None:
        self._rpc("update_weights", named_tensors, kind, lora_config)

    def update_weights_ipc(
        self, payload: Any, *, kind: str, lora_config: dict[str, Any] | None
    ) -> None:
        self._rpc("update_weights_ipc", payload, kind, lora_config)

    def weight_checksums(self, names: list[str]) -> dict[str, int]:
        return dict(self._rpc("weight_checksums", names)[0])

    def sleep(self) -> None:
        """vLLM-Omni's own worker ``sleep(level=1)``: weights offloaded."""
        self._rpc("sleep", 1)

    def wake_up(self) -> None:
        self._rpc("wake_up")


def rpc_results(omni: Any, method: str, args: tuple[Any, ...]) -> list[Any]:
    """One result per worker replica of ``collective_rpc(method, args=args)`` on ``omni``
    (an ``Omni``: through ``omni.engine``; anything with ``collective_rpc``: directly)."""
    target = (
        omni if callable(getattr(omni, "collective_rpc", None)) else getattr(omni, "engine", None)
    )
    rpc = getattr(target, "collective_rpc", None)
    if not callable(rpc):
        raise RuntimeError(
            f"vLLM-Omni {type(omni).__name__} exposes no collective_rpc (neither itself nor its "
            f"engine), so '{method}' cannot reach the diffusion workers; vLLM-Omni 0.30 is supported"
        )
    results = list(rpc(method, args=tuple(args)))
    todo = [r for r in results if isinstance(r, dict) and r.get("todo")]
    if todo:
        raise RuntimeError(
            f"vLLM-Omni answered collective_rpc('{method}') with {todo[0]} (not supported by a stage)"
        )
    return results


def _to_tensor(image: Any) -> torch.Tensor:
    if isinstance(image, torch.Tensor):
        return image
    import numpy as np

    return torch.from_numpy(np.asarray(image).copy())
