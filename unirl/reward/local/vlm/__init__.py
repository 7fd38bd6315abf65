"""VLM rewards on one engine (:mod:`.engine`): the trained reward models HPSv3, VideoAlign
(VideoReward) and EditReward (hidden states at reward tokens through their heads) and the
generative judges UnifiedReward-2.0 and WISE (greedy generation, parsed verdicts). Released
prompt templates: :mod:`.templates`; checkpoint conversion: ``python -m
unirl.reward.local.vlm.convert``."""

from __future__ import annotations

from unirl.reward.local.vlm.edit_reward import EditReward
from unirl.reward.local.vlm.engine import QwenVLScorer, ranknet_head, sample_frames, video_patches
from unirl.reward.local.vlm.hpsv3 import HPSv3
from unirl.reward.local.vlm.judges import (
    GenerativeJudge,
    UnifiedReward,
    Unparsed,
    WISEJudge,
    parse_final_score,
    parse_wise,
    wiscore,
)
from unirl.reward.local.vlm.videoalign import VideoAlign

__all__ = [
    "EditReward",
    "GenerativeJudge",
    "HPSv3",
    "QwenVLScorer",
    "UnifiedReward",
    "Unparsed",
    "VideoAlign",
    "WISEJudge",
    "parse_final_score",
    "parse_wise",
    "ranknet_head",
    "sample_frames",
    "video_patches",
    "wiscore",
]
