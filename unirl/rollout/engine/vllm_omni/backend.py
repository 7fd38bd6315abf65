"""The in-process vLLM-Omni diffusion engine behind ``VllmOmniEngine``.

Written against vLLM-Omni's public Python entry point as published (``Omni(model=...)``,
``Omni.generate(prompts, OmniDiffusionSamplingParams(...))`` with pinned ``latents`` and
``return_trajectory_latents``). Two parts are assumptions this machine could not check
(no GPU, and vLLM-Omni needs its own environment): the attribute names of the outputs
(``images``, ``trajectory_latents``, ``trajectory_timesteps``, and a per-step log-prob field,
``log_prob_attr``), and weight updates through vLLM's ``collective_rpc`` convention
(``update_weights`` / ``weight_checksums`` / ``sleep`` / ``wake_up`` worker methods).
Video families: each entry of ``images`` is assumed to be one sample's frames (the adapter
reads it as ``[T, H, W, 3]`` or ``[T, 3, H, W]``; see ``video.py``).
Each assumption fails with a message naming it rather than guessing further.
"""

from __future__ import annotations

from typing import Any

import torch

EXTRA_HINT = "pip install 'unirl-mm[vllm]'"


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

        self.omni = Omni(model=model_path, **(omni_kwargs or {}))
        self.log_prob_attr = log_prob_attr

    def generate(self, prompt: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        outputs = self.omni.generate(prompt, OmniDiffusionSamplingParams(**params))
        samples: list[dict[str, Any]] = []
        for out in outputs if isinstance(outputs, list | tuple) else [outputs]:
            images = getattr(out, "images", None)
            traj = getattr(out, "trajectory_latents", None)
            if images is None or traj is None:
                raise RuntimeError(
                    f"vLLM-Omni output {type(out).__name__} lacks images / trajectory_latents "
                    "(return_trajectory_latents=True); this adapter cannot map it"
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
        rpc = getattr(self.omni, "collective_rpc", None)
        if rpc is None:
            raise RuntimeError(
                f"vLLM-Omni's Omni has no collective_rpc here, so '{method}' cannot reach the diffusion "
                "workers; this adapter needs a vLLM-Omni build with worker RPC for weight updates"
            )
        return list(rpc(method, args=args))

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
        self._rpc("sleep")

    def wake_up(self) -> None:
        self._rpc("wake_up")


def _to_tensor(image: Any) -> torch.Tensor:
    if isinstance(image, torch.Tensor):
        return image
    import numpy as np

    return torch.from_numpy(np.asarray(image).copy())
