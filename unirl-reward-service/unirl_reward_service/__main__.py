"""``python -m unirl_reward_service --config <file>``."""

from __future__ import annotations

from unirl_reward_service.cli import main

raise SystemExit(main())
