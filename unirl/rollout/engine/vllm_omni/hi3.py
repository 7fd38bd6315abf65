"""HunyuanImage-3.0 served by vLLM-Omni: the unified (text, then image) adapter, over HTTP.

HunyuanImage-3.0 is one autoregressive multimodal model (an 80B MoE on a Hunyuan-A13B
backbone) that can write a "think" or "recaption" text after the user's prompt and then
generate the image in the same sequence by denoising latents. :class:`Hi3OmniEngine` asks a
vLLM-Omni deployment for both stages of every sample in one call and maps the answer into the
two tracks of the unified domain (``unirl.trainer.unified_model``): ``text`` (prompt and
written tokens, per-token log-probs, loss mask) and ``image`` (the trajectory at the
driver-chosen SDE steps, their log-probs, the final latent, the decoded image), the image's
``parent_ids`` naming its text sample, its conditions the exact context token ids.

The driver authors everything random, as for every engine: the text stage's seed ids and
sampling knobs (``TextRequest``), the x_T of every image (its ``DiffusionRequest``: sent as
fp32 bytes, so the server starts exactly where trainside would), the σ schedule and the SDE
steps. The wire format is :data:`ROUTE` (JSON; arrays as base64 little-endian float32 with
their shape), written out in README.md; every answer is checked (sample ids in order, token
and log-prob counts, timesteps = 1000·σ, latent shapes, finite values) and a violation raises
:class:`Hi3ContractError` naming the sample and the field.
"""

from __future__ import annotations

import base64
import io
import math
import time
from typing import Any, Literal

import numpy as np
import torch

from unirl.config.require import require
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.models.common_ar.conditions import PromptConditions
from unirl.models.unified.conditions import ContextConditions
from unirl.types import (
    DiffusionRequest,
    Images,
    LatentSegment,
    Packed,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    TextRequest,
    Texts,
    TextSegment,
)

ROUTE = "/v1/unirl/hi3/generate"
TEXT_TRACK = "text"
IMAGE_TRACK = "image"


class Hi3ContractError(RuntimeError):
    """The server's answer breaks the adapter's contract (README.md, *Wire format*)."""


def encode_array(t: torch.Tensor) -> dict[str, Any]:
    """``{"shape", "dtype": "float32", "b64"}``: little-endian fp32 bytes, base64."""
    a = t.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4")
    return {
        "shape": list(a.shape),
        "dtype": "float32",
        "b64": base64.b64encode(a.tobytes()).decode(),
    }


def decode_array(obj: Any, where: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """The tensor of an :func:`encode_array` object; ``shape`` checked when given."""
    if not isinstance(obj, dict) or obj.get("dtype") != "float32" or "b64" not in obj:
        raise Hi3ContractError(
            f"{where}: expected {{shape, dtype: float32, b64}}, got {obj!r:.200}"
        )
    got = tuple(int(d) for d in obj.get("shape", ()))
    raw = base64.b64decode(obj["b64"])
    if len(raw) != 4 * math.prod(got):
        raise Hi3ContractError(f"{where}: {len(raw)} bytes for shape {got}")
    if shape is not None and got != tuple(shape):
        raise Hi3ContractError(f"{where}: shape {got}, expected {tuple(shape)}")
    return torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy()).reshape(got)


def decode_png(b64: Any, where: str) -> torch.Tensor:
    """``pixels[3, H, W]`` float32 in [0, 1] of a base64 PNG."""
    from PIL import Image

    if not isinstance(b64, str):
        raise Hi3ContractError(f"{where}: expected a base64 PNG string")
    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255.0


class HttpClient:
    """POSTs JSON to the deployment at ``base_url`` (httpx, imported here)."""

    def __init__(self, *, base_url: str, timeout_s: float, api_key: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, headers=headers)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        resp = self.http.post(path, json=body)
        if resp.status_code >= 400:
            raise RuntimeError(f"vLLM-Omni {path} -> HTTP {resp.status_code}: {resp.text[:500]}")
        return resp.json()


class Hi3OmniEngine:
    """The HunyuanImage-3.0 adapter (see the module docstring).

    ``base_url``: the vLLM-Omni deployment (``http://host:port``). ``mode``: ``think`` (reason,
    then draw) or ``recaption`` (rewrite the prompt, then draw): HunyuanImage-3.0's two
    text-before-image modes. ``timeout_s`` / ``api_key``: the HTTP call. ``client``: an object
    with ``post(path, body) -> dict`` (tests inject one; default :class:`HttpClient`).
    """

    engine_kind = "vllm_omni"
    text_track = TEXT_TRACK
    image_track = IMAGE_TRACK

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        mode: Literal["think", "recaption"] = "think",
        timeout_s: float = 600.0,
        api_key: str | None = None,
        client: Any = None,
    ) -> None:
        require(
            mode in ("think", "recaption"),
            f"rollout.mode={mode!r} must be 'think' or 'recaption' (HunyuanImage-3.0's modes)",
        )
        require(timeout_s > 0, f"rollout.timeout_s={timeout_s} must be > 0")
        self.base_url = base_url
        self.mode = mode
        self.timeout_s = timeout_s
        self.api_key = api_key
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = HttpClient(
                base_url=self.base_url, timeout_s=self.timeout_s, api_key=self.api_key
            )
        return self._client

    # -- the wire ------------------------------------------------------------------------------

    def request_body(self, req: RolloutReq) -> dict[str, Any]:
        """The JSON body of one call: every sample's prompt, text knobs and image recipe."""
        text = req.params_for(TEXT_TRACK, TextRequest)
        image = req.params_for(IMAGE_TRACK, DiffusionRequest)
        params = image.own_sampling()
        x_T = image.initial_noise(req.seed)
        sigmas = image.sigmas.float().tolist()
        samples = []
        for i, sid in enumerate(req.sample_ids.tolist()):
            samples.append(
                {
                    "sample_id": int(sid),
                    "prompt": req.prompts[i],
                    "text": {
                        "seed_id": int(text.seed_ids[i]),
                        "max_new_tokens": int(text.max_new_tokens),
                        "temperature": float(text.temperature),
                        "top_p": float(text.top_p),
                        "top_k": int(text.top_k),
                        "stop": list(text.stop),
                    },
                    "image": {
                        "height": int(params.height),
                        "width": int(params.width),
                        "guidance_scale": float(params.guidance_for(req.mode)),
                        "eta": float(params.eta),
                        "sigmas": sigmas,
                        "sde_indices": [int(j) for j in image.sde_indices[i].tolist()],
                        "x_T": encode_array(x_T[i]),
                    },
                }
            )
        return {
            "mode": self.mode,
            "seed": int(req.seed),
            "rollout_index": int(req.rollout_index),
            "samples": samples,
            "return": {"text_log_probs": True, "sde_trajectory": True, "image": "png"},
        }

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """This rank's shard: one call, two tracks on CPU."""
        t0 = time.perf_counter()
        data = self.client.post(ROUTE, self.request_body(req))
        t_call = time.perf_counter() - t0
        resp = self.tracks(req, data)
        resp.timings["vllm_omni/call"] = t_call
        return resp

    def tracks(self, req: RolloutReq, data: Any) -> RolloutResp:
        """The ``text`` and ``image`` tracks of an answer (checked against the request)."""
        image_req = req.params_for(IMAGE_TRACK, DiffusionRequest)
        text_req = req.params_for(TEXT_TRACK, TextRequest)
        samples = data.get("samples") if isinstance(data, dict) else None
        ids = req.sample_ids.tolist()
        if not isinstance(samples, list) or len(samples) != len(ids):
            raise Hi3ContractError(
                f"expected {len(ids)} samples in the answer, got "
                f"{len(samples) if isinstance(samples, list) else type(samples).__name__}"
            )
        shape = tuple(image_req.init_noise_shape)
        sigmas = image_req.sigmas.float()
        expected_t = sigmas * 1000.0
        rows, logps, masks, prompt_lengths, contexts, texts, meta = [], [], [], [], [], [], []
        lat, nxt, final, sde_logp, pixels = [], [], [], [], []
        for i, (sid, s) in enumerate(zip(ids, samples, strict=True)):
            where = f"sample {sid}"
            if not isinstance(s, dict) or s.get("sample_id") != sid:
                got = s.get("sample_id") if isinstance(s, dict) else s
                raise Hi3ContractError(f"{where}: the answer's sample {i} has sample_id {got!r}")
            prompt = [int(t) for t in s.get("prompt_token_ids", [])]
            out = [int(t) for t in s.get("output_token_ids", [])]
            out_lp = [float(v) for v in s.get("output_log_probs", [])]
            if not prompt or not out:
                raise Hi3ContractError(
                    f"{where}: prompt_token_ids and output_token_ids must be non-empty"
                )
            if len(out_lp) != len(out):
                raise Hi3ContractError(
                    f"{where}: {len(out)} output tokens but {len(out_lp)} output_log_probs"
                )
            if len(out) > int(text_req.max_new_tokens):
                raise Hi3ContractError(
                    f"{where}: {len(out)} output tokens over max_new_tokens={text_req.max_new_tokens}"
                )
            if not all(math.isfinite(v) and v <= 0.0 for v in out_lp):
                raise Hi3ContractError(f"{where}: output_log_probs must be finite and <= 0")
            finish = s.get("finish_reason")
            if finish not in ("stop", "length"):
                raise Hi3ContractError(f"{where}: finish_reason {finish!r} is not stop|length")
            timesteps = torch.tensor([float(t) for t in s.get("timesteps", [])])
            if timesteps.shape != expected_t.shape or not torch.allclose(
                timesteps, expected_t, atol=1e-3, rtol=0
            ):
                raise Hi3ContractError(
                    f"{where}: timesteps {timesteps.tolist()[:4]}... are not 1000·σ of the "
                    "request's schedule (the server must use the pinned σ)"
                )
            steps = len(image_req.sde_indices[i])
            lat.append(decode_array(s.get("sde_latents"), f"{where}: sde_latents", (steps, *shape)))
            nxt.append(
                decode_array(
                    s.get("sde_next_latents"), f"{where}: sde_next_latents", (steps, *shape)
                )
            )
            final.append(decode_array(s.get("final_latents"), f"{where}: final_latents", shape))
            step_lp = torch.tensor([float(v) for v in s.get("sde_log_probs", [])])
            if step_lp.shape != (steps,) or not torch.isfinite(step_lp).all():
                raise Hi3ContractError(f"{where}: sde_log_probs must be {steps} finite values")
            sde_logp.append(step_lp)
            pixels.append(decode_png(s.get("image_png"), f"{where}: image_png"))
            rows.append(torch.tensor(prompt + out, dtype=torch.long))
            logps.append(torch.tensor([0.0] * len(prompt) + out_lp, dtype=torch.float32))
            masks.append(torch.tensor([False] * len(prompt) + [True] * len(out)))
            prompt_lengths.append(len(prompt))
            contexts.append(torch.tensor(prompt + out, dtype=torch.long))
            texts.append(str(s.get("text", "")))
            meta.append(
                {**req.metadata[i], "response_tokens": len(out), "finish_reason": finish}
                if req.metadata
                else {"response_tokens": len(out), "finish_reason": finish}
            )
        sizes = {tuple(p.shape) for p in pixels}
        if len(sizes) != 1:
            raise Hi3ContractError(f"decoded images differ in size: {sorted(sizes)}")
        tokens = Packed.from_list(rows)
        text_track = RolloutTrack(
            sample_ids=req.sample_ids.clone(),
            group_ids=req.group_ids.clone(),
            prompts=list(req.prompts),
            metadata=meta,
            conditions=PromptConditions(
                prompt_lengths=torch.tensor(prompt_lengths, dtype=torch.long),
                temperature=float(text_req.temperature) if text_req.temperature > 0 else 1.0,
            ),
            segment=TextSegment(
                tokens=tokens,
                log_probs=Packed(values=torch.cat(logps), offsets=tokens.offsets),
                loss_mask=Packed(values=torch.cat(masks), offsets=tokens.offsets),
            ),
            decoded=Texts(texts=texts),
        )
        params = image_req.own_sampling()
        image_track = RolloutTrack(
            sample_ids=req.sample_ids.clone(),
            group_ids=req.group_ids.clone(),
            prompts=list(req.prompts),
            metadata=[{**m, "thought": t} for m, t in zip(meta, texts, strict=True)],
            conditions=ContextConditions(context=Packed.from_list(contexts)),
            segment=LatentSegment(
                sigmas=sigmas,
                sde_indices=image_req.sde_indices.clone(),
                latents=torch.stack(lat),
                next_latents=torch.stack(nxt),
                final_latents=torch.stack(final),
                sde_logp=torch.stack(sde_logp),
                guidance_scale=float(params.guidance_for(req.mode)),
                strategy="vllm_omni",
            ),
            decoded=Images(pixels=torch.stack(pixels)),
            parent_ids=req.sample_ids.clone(),
            parent_track=TEXT_TRACK,
        )
        return RolloutResp(tracks={TEXT_TRACK: text_track, IMAGE_TRACK: image_track}, timings={})

    @distributed(dispatch=Dispatch.BROADCAST)
    def sleep(self) -> None:
        self.client.post("/sleep", {})

    @distributed(dispatch=Dispatch.BROADCAST)
    def wake_up(self) -> None:
        self.client.post("/wake_up", {})
