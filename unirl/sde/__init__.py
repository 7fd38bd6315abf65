"""Per-step SDE/ODE kernels, flow-matching σ schedules and SDE-step schedules (see README.md)."""

from __future__ import annotations

from unirl.sde.kernels import (
    CPS,
    ODE,
    STRATEGIES,
    DanceSDE,
    FlowSDE,
    SDEStrategy,
    StepOutput,
    build_strategy,
)
from unirl.sde.schedule import (
    dynamic_shift_mu,
    flow_match_sigmas,
    sigmas_from_scheduler_config,
    timesteps_from_sigmas,
)
from unirl.sde.sde_steps import AllSteps, RandomSubsetSchedule, SDEStepSchedule, WindowSchedule

__all__ = [
    "CPS",
    "ODE",
    "STRATEGIES",
    "AllSteps",
    "DanceSDE",
    "FlowSDE",
    "RandomSubsetSchedule",
    "SDEStepSchedule",
    "SDEStrategy",
    "StepOutput",
    "WindowSchedule",
    "build_strategy",
    "dynamic_shift_mu",
    "flow_match_sigmas",
    "sigmas_from_scheduler_config",
    "timesteps_from_sigmas",
]
