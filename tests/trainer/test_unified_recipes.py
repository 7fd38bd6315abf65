"""``unirl.train_unified_model``'s checks before Ray: each broken tiny recipe is refused with
one line naming the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from unirl.config.entry import compose_recipe
from unirl.config.require import ConfigError
from unirl.config.validate import validate
from unirl.trainer.unified_model import check_unified_recipe


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["unified.image.sampling.guidance_scale=4.0"], "no unconditional branch; set it to 1"),
        (["unified.image.sampling.samples_per_prompt=2"], "one image per text sample"),
        (["~unified"], "needs a `unified` block"),
        (["+unified.image.bogus=1"], "unified.image"),
        (
            ["unified.image.pipeline.strategy._target_=unirl.sde.ODE"],
            "trains on SDE log-probs; use unirl.sde.FlowSDE",
        ),
        (
            ["pipeline._target_=unirl.models.qwen3.Qwen3Pipeline"],
            "is not a TransfusionTextPipeline",
        ),
        (
            ["stack.text.max_tokens_per_micro_batch=null", "+stack.text.micro_batch_size=3"],
            "not divisible by stack.text.micro_batch_size=3",
        ),
        (["stack.text.weight=0", "stack.image.weight=0"], "both 0: nothing would train"),
    ],
)
def test_broken_unified_recipes_are_refused(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    data = compose_recipe(
        "unified_model/unified_tiny", [f"output_dir={tmp_path / 'run'}", *overrides]
    )
    with pytest.raises(ConfigError, match=message) as info:
        cfg, objs = validate(data)
        check_unified_recipe(cfg, objs)
    assert "\n" not in str(info.value)
