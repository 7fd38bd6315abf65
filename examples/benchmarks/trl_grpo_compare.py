"""TRL's ``GRPOTrainer`` at the shapes of ``examples/llm/qwen3_4b_grpo_bench.yaml`` (or, with
``--family qwen-vl``, of ``examples/vlm/qwen_vl_3b_grpo_bench.yaml``): the reference side of
the autoregressive GRPO benchmark (``llm_bench.sh`` runs both).

    python examples/benchmarks/trl_grpo_compare.py --prompts P.jsonl [--preset qwen3-4b-arch] \
        [--max-new-tokens 256] [--samples-per-prompt 8] [--micro-batch 8] [--lora-rank 64] \
        [--warmup 1] [--iters 2] [--json OUT.json]
    python examples/benchmarks/trl_grpo_compare.py --tiny      # CPU smoke test, < 1 minute
    python examples/benchmarks/trl_grpo_compare.py --family qwen-vl --prompts VL.jsonl \
        [--preset qwen2.5-vl-3b-arch] [--image-size 448] ...     # VL.jsonl: make_vl_prompts.py
    # the Qwen-VL CPU smoke test of both sides (tiny preset, tiny shapes; TRL importable):
    #   FAMILY=qwen-vl DEVICE=cpu PRESET=tiny IMAGE_SIZE=56 PROMPT_TOKENS=16 NEW_TOKENS=8 \
    #     PROMPTS=2 SPP=4 MICRO=4 ITERS=1 bash examples/benchmarks/llm_bench.sh /tmp/vl_bench_cpu

Same shapes, prompts and lengths as our recipe: a random-init Qwen3 built from our
``qwen3-*-arch`` config (nothing downloaded; bf16 weights on CUDA, sdpa attention), the
fixed-length prompts written by ``make_fixed_prompts.py`` (raw text, no chat template) and
the tokenizer our bundle of that preset uses (``make_fixed_prompts.bundle_tokenizer``), LoRA
through peft on q k v o gate up down (rank 64, alpha 128, dropout 0, adapter weights fp32 as
peft keeps them), ``num_generations`` samples per prompt, exactly ``max_new_tokens``
generated tokens per completion (``min_new_tokens`` = ``max_completion_length``: the
end-of-sequence ids are masked until then), a constant reward of 0, no KL (beta 0, no
reference model), DAPO token-mean loss with clip 0.2 / 0.28, one optimizer step per
generation batch in micro-batches of ``--micro-batch`` completions (gradient accumulation),
no gradient checkpointing.

Timers (our own, CUDA-synchronized): ``generate`` wraps ``GRPOTrainer._generate`` (tokenize,
``model.generate``, decode); ``score`` is the rest of ``_generate_and_score_completions``
(reward, advantages); ``train`` is the optimizer step's wall time (``on_step_begin`` to
``on_step_end``) less both, i.e. every micro-batch's forward + backward, clipping and the
optimizer step. The first ``--warmup`` steps are not timed. Prints one JSON line (and writes it
to ``--json``): generated tokens/s over ``generate``, trained tokens/s over ``train`` (every
non-pad prompt + completion token of the micro-batches), samples/s, seconds per phase and peak
CUDA memory.

``--family qwen-vl`` (Qwen2.5-VL, one image per prompt): a random-init
``Qwen2_5_VLForConditionalGeneration`` from our ``qwen2.5-vl-*-arch`` config (or the ``tiny``
preset folder's config), a ``Qwen2_5_VLProcessor`` built here (``Qwen2VLImageProcessor`` with
its defaults, our bundle's tokenizer, a ChatML template that renders an image part as
``<|vision_start|><|image_pad|><|vision_end|>``), a dataset with ``prompt`` (one user turn) and
``image`` (the PNG of ``make_vl_prompts.py``) columns, LoRA on the recipe's suffixes
(``self_attn.{q,k,v,o}_proj``), the four vision markers suppressed as on our side. Before
training it checks that the processor's prompt ids equal our bundle's ``encode_prompts`` and
its ``pixel_values`` our ``patchify`` of the same file (to 1e-5), so both sides read the same
tokens and pixels.

Needs trl 1.16.0 and datasets (``examples/benchmarks/trl_wheels.sh`` downloads the wheels the
GPU machine lacks).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository: unirl's arch configs
sys.path.insert(0, str(HERE))  # make_fixed_prompts

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# the language model's attention only: the MLP suffixes would match the vision tower's blocks
VL_LORA_TARGETS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
# ChatML as our bundle's tokenizer renders it, with an image part as the vision markers around
# one placeholder (the processor expands it to the image's token count)
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_SHAPES = {  # a Qwen3 of the same layout, small enough for a CPU test
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1024,  # above the tokenizer's 384 ids, as the 4B vocabulary is
    "tie_word_embeddings": True,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=Path, default=None, help="make_fixed_prompts.py output")
    p.add_argument("--family", choices=["qwen3", "qwen-vl"], default="qwen3")
    p.add_argument(
        "--preset", default=None, help="qwen3-*-arch | qwen2.5-vl-*-arch | tiny (family default)"
    )
    p.add_argument("--image-size", type=int, default=448, help="qwen-vl: the images' side")
    p.add_argument("--tiny", action="store_true", help="tiny Qwen3 on CPU, tiny shapes")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--samples-per-prompt", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=8, help="completions per micro-batch")
    p.add_argument("--lora-rank", type=int, default=64)
    p.add_argument("--lora-alpha", type=float, default=128.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--stop-fraction",
        type=float,
        default=0.0,
        help="ids 1..floor(p*V) stop a completion (our StopSetQwen3Bundle's set): uneven lengths",
    )
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.preset is None:
        args.preset = "qwen3-4b-arch" if args.family == "qwen3" else "qwen2.5-vl-3b-arch"
    if args.family == "qwen-vl":
        if args.tiny:
            args.preset = "tiny"
        if args.prompts is None:
            p.error("--family qwen-vl needs --prompts (make_vl_prompts.py writes them)")
        if args.stop_fraction:
            p.error("--stop-fraction is for --family qwen3")
    if args.tiny:
        args.max_new_tokens = min(args.max_new_tokens, 8)
        args.samples_per_prompt = min(args.samples_per_prompt, 4)
        args.micro_batch = min(args.micro_batch, 4)
        args.lora_rank = min(args.lora_rank, 8)
        args.lora_alpha = 2.0 * args.lora_rank
        args.iters = min(args.iters, 1)
    elif args.prompts is None:
        p.error("--prompts is required (make_fixed_prompts.py writes it) unless --tiny")
    if args.warmup < 0 or args.iters < 1:
        p.error("--warmup must be >= 0 and --iters >= 1")
    return args


def load_prompts(args: argparse.Namespace) -> tuple[list[str], Any]:
    """The prompts (``--prompts``, or with ``--tiny`` and none given two 16-token prompts
    made here) and the tokenizer our Qwen3 bundle of ``--preset`` uses (``--tiny``: the
    ``*-arch`` presets')."""
    from make_fixed_prompts import bundle_tokenizer, fixed_length_prompt

    tokenizer = bundle_tokenizer("qwen3-4b-arch" if args.tiny else args.preset)
    if args.prompts is not None:
        rows = [json.loads(x) for x in args.prompts.read_text().splitlines() if x.strip()]
        return [r["prompt"] for r in rows], tokenizer
    return [fixed_length_prompt(tokenizer, 16, seed) for seed in range(2)], tokenizer


def load_vl_prompts(args: argparse.Namespace) -> tuple[list[str], list[str], Any]:
    """The texts and image paths of ``--prompts`` (``make_vl_prompts.py``'s format) and the
    prompt formatter of our ``QwenVLBundle`` of ``--preset`` (its tokenizer and prompt ids)."""
    from unirl.models.qwen_vl import QwenVLBundle

    rows = [json.loads(x) for x in args.prompts.read_text().splitlines() if x.strip()]
    images = []
    for r in rows:
        uri = Path(r["media"][0]["uri"])
        images.append(str(uri if uri.is_absolute() else args.prompts.parent / uri))
    block = {"path": args.preset, "chat_template": True, "image_size": args.image_size}
    return [r["prompt"] for r in rows], images, QwenVLBundle.prompt_formatter(block)


class _ImageOnlyProcessorMixin:
    """``Qwen2_5_VLProcessor`` without a video processor (transformers builds one only with
    torchvision; no video is ever passed here)."""

    def check_argument_for_proper_class(self, name: str, arg: Any) -> Any:
        if name == "video_processor" and arg is None:
            return None
        return super().check_argument_for_proper_class(name, arg)  # type: ignore[misc]


def build_vl_processor(tokenizer: Any) -> Any:
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor

    cls = type("ImageOnlyQwen2_5_VLProcessor", (_ImageOnlyProcessorMixin, Qwen2_5_VLProcessor), {})
    return cls(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=VL_CHAT_TEMPLATE,
    )


def vl_messages(text: str, image: Any = None) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = (
        [{"type": "image"}] if image is None else [{"type": "image", "image": image}]
    )
    return [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]


def check_vl_inputs(
    processor: Any, formatter: Any, texts: list[str], image_paths: list[str], size: int
) -> None:
    """Both sides read the same prompt ids (TRL's processor vs our ``encode_prompts``) and the
    same pixels (the processor's ``pixel_values`` vs our ``patchify`` of the file as our
    driver loads it), or a one-line error."""
    import torch
    from PIL import Image

    from unirl.data.media import ReferenceImages
    from unirl.models.qwen_vl.vision import patchify

    ours = formatter.encode_prompts(texts)
    loader = ReferenceImages(size, size)
    for i, (text, path) in enumerate(zip(texts, image_paths, strict=True)):
        with Image.open(path) as img:
            if img.size != (size, size):
                raise SystemExit(f"{path} is {img.size}, not {size}x{size}: pass --image-size")
            rgb = img.convert("RGB")
        out = processor.apply_chat_template(
            conversation=[vl_messages(text, rgb)],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        ids = out["input_ids"][0].tolist()
        if ids != ours[i]:
            raise SystemExit(
                f"prompt {i}: TRL's processor gives {len(ids)} ids, our bundle {len(ours[i])}; "
                "the chat template (VL_CHAT_TEMPLATE) no longer renders our bundle's prompt"
            )
        pixels, grid = patchify(loader.load(path))
        theirs = torch.as_tensor(out["pixel_values"], dtype=torch.float32)
        gap = (theirs - pixels).abs().max().item() if theirs.shape == pixels.shape else None
        if gap is None or gap > 1e-5 or out["image_grid_thw"][0].tolist() != grid.tolist():
            raise SystemExit(
                f"image {i}: the processor's pixel_values differ from our patchify "
                f"(shapes {tuple(theirs.shape)} / {tuple(pixels.shape)}, max gap {gap})"
            )


def build_vl_model(args: argparse.Namespace, device: str) -> Any:
    """A random-init ``Qwen2_5_VLForConditionalGeneration`` at our ``--preset`` config."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from unirl.models.qwen_vl import QwenVLBundle
    from unirl.models.qwen_vl.presets import tiny_preset_path

    if args.preset == "tiny":
        config = Qwen2_5_VLConfig.from_pretrained(str(tiny_preset_path()))
    else:
        config = Qwen2_5_VLConfig(**QwenVLBundle.arch_config(args.preset))
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        torch.manual_seed(0)
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
    return model


def vl_dataset(datasets: Any, texts: list[str], image_paths: list[str]) -> Any:
    """``prompt`` (one user turn, the text) and ``image`` (the file, decoded to PIL by
    datasets) columns; the fingerprint is given as in :func:`prompt_dataset`."""
    from datasets.table import InMemoryTable

    text = datasets.Value("string")
    features = datasets.Features(
        {"prompt": [{"role": text, "content": text}], "image": datasets.Image()}
    )
    rows = {
        "prompt": [[{"role": "user", "content": t}] for t in texts],
        "image": [{"path": p, "bytes": None} for p in image_paths],
    }
    table = InMemoryTable.from_pydict(features.encode_batch(rows), schema=features.arrow_schema)
    info = datasets.DatasetInfo(features=features)
    return datasets.Dataset(table, info=info, fingerprint=f"unirl-vl-bench-{len(texts)}-prompts")


def build_model(args: argparse.Namespace, tokenizer: Any, device: str) -> Any:
    """A random-init ``Qwen3ForCausalLM`` at our ``--preset`` config (``qwen3-*-arch``, or
    ``tiny``: the tiny preset folder's config) or ``--tiny``'s shapes, built on ``device``:
    bf16 on CUDA, fp32 on CPU."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from unirl.models.qwen3.arch import arch_config
    from unirl.models.qwen3.presets import tiny_preset_path

    if args.preset == "tiny" and not args.tiny:
        config = Qwen3Config.from_pretrained(str(tiny_preset_path()))
    else:
        shapes = arch_config(args.preset)
        if args.tiny:
            shapes.update(TINY_SHAPES, bos_token_id=None, eos_token_id=tokenizer.eos_token_id)
        config = Qwen3Config(**shapes)
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    return model


def prompt_dataset(datasets: Any, prompts: list[str]) -> Any:
    """A ``datasets.Dataset`` with one ``prompt`` column. Its fingerprint is given:
    datasets 5.2.0 hashes a new in-memory table with its own dill pickler, which fails here
    (``PicklingError: Can't pickle <class 'MonthDayNano'>`` with pyarrow 24-26, Python 3.11);
    nothing here caches on it."""
    from datasets.table import InMemoryTable

    table = InMemoryTable.from_pydict({"prompt": list(prompts)})
    return datasets.Dataset(table, fingerprint=f"unirl-bench-{len(prompts)}-prompts")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import peft
        import torch
        import transformers
        import trl
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        import datasets
    except ImportError as exc:
        raise SystemExit(
            f"trl_grpo_compare needs trl and datasets ({exc}); download the wheels with "
            "bash examples/benchmarks/trl_wheels.sh and install them with pip --target"
        ) from exc

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    vl = args.family == "qwen-vl"
    generation_kwargs: dict[str, Any] = {"min_new_tokens": args.max_new_tokens}
    if vl:
        prompts, image_paths, formatter = load_vl_prompts(args)
        processing_class = build_vl_processor(formatter.tokenizer)
        check_vl_inputs(processing_class, formatter, prompts, image_paths, args.image_size)
        train_dataset = vl_dataset(datasets, prompts, image_paths)
        # the vision markers, never generated (our sampler suppresses the same four)
        generation_kwargs["suppress_tokens"] = list(formatter.suppressed_token_ids)
        lora_targets = VL_LORA_TARGETS
    else:
        prompts, processing_class = load_prompts(args)
        train_dataset = prompt_dataset(datasets, prompts)
        lora_targets = LORA_TARGETS
    n_prompts, spp = len(prompts), args.samples_per_prompt
    samples = n_prompts * spp
    if samples % args.micro_batch:
        raise SystemExit(f"{n_prompts} prompts x {spp} samples is no multiple of --micro-batch")
    model = build_vl_model(args, device) if vl else build_model(args, processing_class, device)
    if args.stop_fraction:
        from unirl.tools.fixed_length import stop_set

        # GRPOTrainer reads its stop ids from the model's generation config (and masks the
        # completion after the first of them): the same set as our side's bundle
        model.generation_config.eos_token_id = stop_set(model.config.vocab_size, args.stop_fraction)
        generation_kwargs = {}

    timers: dict[str, list[float]] = defaultdict(list)
    counts: list[dict[str, float]] = []

    class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc, valid-type]
        def _generate(self, prompts: list) -> Any:  # type: ignore[override]
            sync()
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            sync()
            timers["generate"].append(time.perf_counter() - t0)
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:  # type: ignore[override]
            sync()
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            sync()
            timers["generate_and_score"].append(time.perf_counter() - t0)
            prompt_mask, completion_mask = out["prompt_mask"], out["completion_mask"]
            counts.append(
                {
                    "prompt": float(prompt_mask.sum()),
                    "generated": float(completion_mask.sum()),
                    "padded": float(prompt_mask.numel() + completion_mask.numel()),
                    "samples": float(prompt_mask.shape[0]),
                }
            )
            return out

    class StepTimer(TrainerCallback):  # type: ignore[misc, valid-type]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync()
            timers["step"].append(time.perf_counter() - self.t0)

    def constant_reward(completions: list, **_: Any) -> list[float]:
        return [0.0] * len(completions)

    steps = args.warmup + args.iters
    with tempfile.TemporaryDirectory() as scratch:
        config = GRPOConfig(
            output_dir=scratch,
            per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=samples // args.micro_batch,
            num_generations=spp,
            max_completion_length=args.max_new_tokens,
            generation_kwargs=generation_kwargs,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",
            scale_rewards="group",
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_steps=steps,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            gradient_checkpointing=args.gradient_checkpointing,
            bf16=cuda,
            use_cpu=not cuda,
            seed=0,
            shuffle_dataset=False,
            remove_unused_columns=False,
            disable_dropout=True,
            log_completions=False,
            dataloader_num_workers=0,
        )
        lora = peft.LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha,
            lora_dropout=0.0,
            target_modules=lora_targets,
            task_type="CAUSAL_LM",
        )
        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=[constant_reward],
            args=config,
            train_dataset=train_dataset,
            processing_class=processing_class,
            peft_config=lora,
            callbacks=[StepTimer()],
        )
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()

    if len(timers["step"]) != steps or len(counts) != steps:
        raise SystemExit(
            f"expected {steps} optimizer steps with one generation each, timed "
            f"{len(timers['step'])} steps and {len(counts)} generations"
        )

    def timed_mean(values: list[float]) -> float:
        kept = values[args.warmup :]
        return sum(kept) / len(kept)

    generate = timed_mean(timers["generate"])
    gen_and_score = timed_mean(timers["generate_and_score"])
    step = timed_mean(timers["step"])
    train = step - gen_and_score
    tokens = {k: timed_mean([c[k] for c in counts]) for k in ("prompt", "generated", "padded")}
    trained = tokens["prompt"] + tokens["generated"]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    out = {
        "framework": "trl",
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "datasets": datasets.__version__,
            "torch": torch.__version__,
        },
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "family": args.family,
        "model": "tiny" if args.tiny else args.preset,
        "trainable_params": trainable,
        "timed_steps": args.iters,
        "samples_per_step": samples,
        "tokens_per_step": {
            "prompt": tokens["prompt"],
            "generated": tokens["generated"],
            "trained": trained,
            "trained_padded": tokens["padded"],
        },
        "prompt_tokens_per_sample": tokens["prompt"] / samples,
        "generated_tokens_per_sample": tokens["generated"] / samples,
        "seconds_per_phase": {
            "generate": generate,
            "score": gen_and_score - generate,
            "train": train,
            "total": step,
        },
        "compile_and_warmup_s": sum(timers["step"][: args.warmup]),
        "generated_tokens_per_s": tokens["generated"] / generate,
        "trained_tokens_per_s": trained / train,
        "samples_per_s": samples / step,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
        "config": {
            "prompts": n_prompts,
            "samples_per_prompt": spp,
            "max_new_tokens": args.max_new_tokens,
            "micro_batch": args.micro_batch,
            "gradient_accumulation_steps": samples // args.micro_batch,
            "lora_rank": args.lora_rank,
            "lora_alpha": args.lora_alpha,
            "gradient_checkpointing": args.gradient_checkpointing,
            "stop_fraction": args.stop_fraction,
            "image_size": args.image_size if vl else None,
            "image_processor": type(processing_class.image_processor).__name__ if vl else None,
            "dtype": "bf16" if cuda else "fp32",
        },
    }
    line = json.dumps(out)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
