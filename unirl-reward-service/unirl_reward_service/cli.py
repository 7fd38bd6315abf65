"""``unirl-reward-service --config <file> [--host H] [--port P]``: load the config, run uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from dataclasses import replace

from unirl.config import ConfigError

from unirl_reward_service.config import ServiceConfig, load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unirl-reward-service",
        description="Serve unirl reward scorers over HTTP (GET /health, GET /rewards, POST /score).",
    )
    parser.add_argument("--config", required=True, help="YAML file with 'server' and 'rewards'")
    parser.add_argument("--host", default=None, help="bind address (default: server.host)")
    parser.add_argument("--port", type=int, default=None, help="port (default: server.port)")
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    return parser


def resolve_config(args: argparse.Namespace) -> ServiceConfig:
    """The file's config with ``--host`` / ``--port`` applied (validated again)."""
    config = load_config(args.config)
    overrides = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if overrides:
        config = replace(config, server=replace(config.server, **overrides))
    return config


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import uvicorn

    from unirl_reward_service.app import create_app
    from unirl_reward_service.connections import ensure_fd_limit, uvicorn_config

    try:
        config = resolve_config(args)
        app = create_app(config)
    except ConfigError as exc:  # one line naming the field and the fix, no traceback
        print(f"unirl-reward-service: config error: {exc}", file=sys.stderr)
        return 2
    server = config.server
    ensure_fd_limit(server.max_connections)
    if not _is_loopback(server.host) and app.state.reward_server.token is None:
        print(
            f"unirl-reward-service: WARNING: binding {server.host} with server.require_auth: "
            "false; anyone who can reach this port can use the scorers "
            "(set server.auth_token_env instead)",
            file=sys.stderr,
        )
    runner = uvicorn.Server(uvicorn_config(app, server, log_level=args.log_level))
    runner.run()
    return 0 if runner.started else 3
