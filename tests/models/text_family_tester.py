"""The contract every autoregressive (text) family proves, written once.

A family's test module subclasses :class:`TextFamilyTester` as ``Test<Family>TextFamily`` and
supplies the hooks at the top of the class: the bundle factory, the pipeline class, the
transformers model whose ``generate`` is the reference (``hf_model``), and, for a family with
media in its prompts, the request's extra primitives (``media``) and the matching inputs of
``generate`` (``hf_inputs``). On the ``tiny`` preset, fp32 on CPU, the inherited tests prove:

(a) greedy generation through our pipeline (the decode engine, the default, and
    ``sampler="loop"``, the reference loop) equals transformers' own
    ``model.generate(do_sample=False)`` token for token, prompt tokens included;
(b) the log-probs the sampler records equal the trainer's replay
    (``pipeline.token_log_probs``) within 2e-6 on every completion token, for both samplers;
    and the first GRPO update through the real ``FSDPBackend`` + LoRA + ``TrainStack`` is
    exactly on-policy (``ratio/min == ratio/max == 1.0``) with ``old_logp_source`` ``replay``
    (the second update has moved) and ``current``;
(c) LoRA (``inject_lora`` on the family's ``lora_default_targets``) with zero B is the base
    bit for bit; non-zero B changes the function; ``adapters_disabled`` gives the base back
    bit for bit, and so does zeroing B again;
(d) a sample depends on its seed id only: generated alone it equals the same sample generated
    in a batch of others (tokens exactly, log-probs within 2e-6), for both samplers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch

from unirl.types import RolloutReq, RolloutTrack, TextRequest, Texts

SAMPLERS = ("engine", "loop")
LOGP_ATOL = 2e-6


class TextFamilyTester:
    """Subclass as ``Test<Family>TextFamily`` and fill in the hooks below."""

    # -- hooks ------------------------------------------------------------------------------

    pipeline_class: ClassVar[Any]  # the family's CausalLMPipeline subclass
    bundle_class: ClassVar[type]  # what the default make_bundle builds
    # bundle fields the tests set besides path / dtype / device (e.g. image_size)
    bundle_fields: ClassVar[dict[str, Any]] = {}
    prompts: ClassVar[tuple[str, ...]] = (
        "What is 3 + 4?",
        "hi",
        "a photo of a cat sitting on a red chair by the window",
        "Find x.",
    )
    max_new_tokens: ClassVar[int] = 12

    def make_bundle(self) -> Any:
        """A fresh fp32 CPU bundle of the ``tiny`` preset."""
        fields = {"path": "tiny", "dtype": "fp32", "device": "cpu", **self.bundle_fields}
        return self.bundle_class(**fields)

    def hf_model(self, bundle: Any) -> Any:
        """The transformers model whose ``generate`` is the reference (``bundle.model``;
        a family whose trainable module wraps the causal LM returns the LM)."""
        return bundle.model

    def media(self, rows: list[int]) -> dict[str, Any]:
        """Extra primitives of a request over ``prompts[rows]`` (none for text alone); a
        function of the row, so a sample alone sees what it sees in a batch."""
        return {}

    def hf_inputs(self, req: RolloutReq, i: int) -> dict[str, Any]:
        """Extra ``generate`` inputs for sample ``i`` of ``req`` (its image, for a VLM)."""
        return {}

    # -- shared pieces ----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    def bundle(self) -> Any:
        """A shared bundle the tests only read (tests that change weights build their own)."""
        return self.make_bundle()

    def request(
        self, rows: list[int], ids: list[int], *, temperature: float = 1.0, seed: int = 0
    ) -> RolloutReq:
        """A text request over ``prompts[rows]`` with sample (and seed) ids ``ids``."""
        seed_ids = torch.tensor(ids)
        return RolloutReq(
            sample_ids=seed_ids,
            group_ids=torch.zeros(len(ids), dtype=torch.long),
            primitives={"text": Texts(texts=[self.prompts[r] for r in rows]), **self.media(rows)},
            stage_params={
                "text": TextRequest(
                    seed_ids=seed_ids, max_new_tokens=self.max_new_tokens, temperature=temperature
                )
            },
            seed=seed,
        )

    def all_rows(self) -> list[int]:
        return list(range(len(self.prompts)))

    def sample(self, bundle: Any, req: RolloutReq, sampler: str = "engine") -> RolloutTrack:
        # three sequences at a time: the loop runs two chunks, the engine refills its slots
        pipe = self.pipeline_class(bundle=bundle, forward_batch_size=3, sampler=sampler)
        return pipe.generate(req).tracks["text"]

    # -- (a) greedy generation equals transformers' ------------------------------------------

    @pytest.mark.parametrize("sampler", SAMPLERS)
    def test_greedy_generation_equals_transformers(self, bundle: Any, sampler: str) -> None:
        rows = self.all_rows()
        req = self.request(rows, rows, temperature=0.0)
        track = self.sample(bundle, req, sampler)
        model = self.hf_model(bundle)
        with bundle.sampling_mode():
            for i, ids in enumerate(bundle.encode_prompts(req.prompts)):
                theirs = model.generate(
                    input_ids=torch.tensor([ids]),
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    do_sample=False,
                    max_new_tokens=self.max_new_tokens,
                    eos_token_id=list(bundle.stop_token_ids),
                    pad_token_id=bundle.pad_token_id,
                    suppress_tokens=list(bundle.prompts.suppressed_token_ids) or None,
                    **self.hf_inputs(req, i),
                )
                ours = track.segment.tokens.row(i).tolist()
                assert ours == theirs[0].tolist(), f"sample {i}: {ours} != {theirs[0].tolist()}"
                assert len(ours) > len(ids)

    # -- (b) recorded log-probs = replay; first ratio exactly 1 ------------------------------

    @pytest.mark.parametrize("sampler", SAMPLERS)
    def test_recorded_log_probs_equal_the_replay(self, bundle: Any, sampler: str) -> None:
        rows = self.all_rows()
        track = self.sample(bundle, self.request(rows, [5, 6, 7, 8]), sampler)
        pipe = self.pipeline_class(bundle=bundle)
        seg = track.segment
        with torch.no_grad():
            replay = pipe.token_log_probs(track.conditions, seg).values
        m = seg.loss_mask.values
        assert int(m.sum()) == sum(meta["response_tokens"] for meta in track.metadata) > 0
        torch.testing.assert_close(seg.log_probs.values[m], replay[m], atol=LOGP_ATOL, rtol=0)
        assert torch.all(replay[~m] == 0) and torch.all(seg.log_probs.values[m] < 0)

    @pytest.mark.parametrize("old_logp_source", ["replay", "current"])
    def test_first_grpo_ratio_is_exactly_one(self, old_logp_source: str) -> None:
        from unirl.algorithms import GRPO
        from unirl.train import FSDPBackend, LoraConfig, TrainStack

        bundle = self.make_bundle()
        pipe = self.pipeline_class(bundle=bundle)
        backend = FSDPBackend(
            bundle=bundle,
            lora=LoraConfig(rank=4, alpha=8),
            optimizer={"lr": 1e-2},
            param_dtype="fp32",
            trainable_attr="model",
        )
        algo = GRPO(policy=pipe, clip_low=0.2, clip_high=0.28, old_logp_source=old_logp_source)
        updates = 2 if old_logp_source == "replay" else 1  # ``current`` needs one step
        stack = TrainStack(
            backend=backend,
            algorithm=algo,
            num_updates_per_batch=updates,
            max_tokens_per_micro_batch=96,
        )
        rows = self.all_rows()
        track = pipe.generate(self.request(rows, rows)).tracks["text"]
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
        out = stack.train_track(dataclasses.replace(track, advantages=advantages), 0)
        first = out["steps"][0]
        assert first["ratio/min"] == 1.0 == first["ratio/max"], first
        if updates == 2:  # the first step moved the policy the second one replays
            second = out["steps"][1]
            assert second["ratio/min"] != 1.0 or second["ratio/max"] != 1.0, second

    # -- (c) LoRA round trip -----------------------------------------------------------------

    def test_lora_changes_the_function_and_disabling_gives_the_base(self, bundle: Any) -> None:
        from unirl.train.lora import LoraConfig, adapters_disabled, inject_lora

        rows = self.all_rows()
        track = self.sample(bundle, self.request(rows, rows))
        own = self.make_bundle()
        pipe = self.pipeline_class(bundle=own)

        def replay() -> torch.Tensor:
            with torch.no_grad():
                return pipe.token_log_probs(track.conditions, track.segment).values

        base = replay()
        inject_lora(own.model, LoraConfig(rank=4, alpha=8), own.lora_default_targets, seed=0)
        lora_b = [p for n, p in own.model.named_parameters() if "lora_B" in n]
        assert lora_b and all(torch.all(p == 0) for p in lora_b)
        assert torch.equal(replay(), base)  # B = 0: the adapter adds exactly nothing
        with torch.no_grad():
            for p in lora_b:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(1))
        moved = replay()
        assert float((moved - base).abs().max()) > 1e-3
        with adapters_disabled(own.model):
            assert torch.equal(replay(), base)
        assert torch.equal(replay(), moved)  # re-enabled on the way out
        with torch.no_grad():
            for p in lora_b:
                p.zero_()
        assert torch.equal(replay(), base)

    # -- (d) a sample alone equals it in a batch ---------------------------------------------

    @pytest.mark.parametrize("sampler", SAMPLERS)
    def test_a_sample_alone_equals_it_in_a_batch(self, bundle: Any, sampler: str) -> None:
        rows = self.all_rows()
        together = self.sample(bundle, self.request(rows, [10, 11, 12, 13]), sampler)
        alone = self.sample(bundle, self.request([2], [12]), sampler)
        row = together.segment.tokens.row(2)
        assert torch.equal(alone.segment.tokens.row(0), row)
        torch.testing.assert_close(
            alone.segment.log_probs.row(0),
            together.segment.log_probs.row(2),
            atol=LOGP_ATOL,
            rtol=0,
        )
        assert alone.decoded.texts[0] == together.decoded.texts[2]
        other = self.sample(bundle, self.request([2], [99]), sampler)  # the seed id matters
        assert not torch.equal(other.segment.tokens.row(0), row)
