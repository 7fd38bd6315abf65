"""Trackers (local files, TensorBoard, W&B), sample galleries and progress bars."""

from __future__ import annotations

from unirl.logging.gallery import contact_sheet, edit_sheet, video_sheet
from unirl.logging.trackers import LocalTracker, MultiTracker, build_trackers

__all__ = [
    "LocalTracker",
    "MultiTracker",
    "build_trackers",
    "contact_sheet",
    "edit_sheet",
    "video_sheet",
]
