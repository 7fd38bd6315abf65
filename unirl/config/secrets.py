"""Keep credentials out of what a run writes: ``config.yaml``, tracker configs, logs.

A recipe may carry a token inline (``reward.backend.token: …``) or through an environment
interpolation (``${oc.env:REWARD_TOKEN}``), and both arrive resolved in the composed dict.
``redact_secrets`` returns a copy in which every value under a credential-like key
(``token``, ``auth_token``, ``api_key``, ``password``, ``secret``, …) is replaced by
``REDACTED`` and the password of a ``scheme://user:password@host`` URL is masked. Keys that
*name* an environment variable (``token_env``) are kept: they hold no secret. Tokenizer
special tokens (``pad_token``, ``eos_token``, …) are not credentials and are kept too.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "***REDACTED***"

_SECRET_SUFFIXES = (
    "token",
    "secret",
    "password",
    "passwd",
    "api_key",
    "apikey",
    "access_key",
    "secret_key",
    "private_key",
    "credentials",
)
_TOKENIZER_TOKENS = re.compile(r"^(pad|eos|bos|unk|sep|cls|mask|stop|start|end|image|video)_token$")
_URL_PASSWORD = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]+:)([^@/\s]+)(@)")


def is_secret_key(key: str) -> bool:
    """True for keys whose value is a credential (``auth_token``), not for ``token_env``."""
    name = key.lower().replace("-", "_")
    if name.endswith("_env") or _TOKENIZER_TOKENS.match(name):
        return False
    return any(name == s or name.endswith("_" + s) for s in _SECRET_SUFFIXES)


def redact_secrets(data: Any) -> Any:
    """A copy of ``data`` (dicts, lists, scalars) with credential values replaced."""
    if isinstance(data, dict):
        return {
            k: (REDACTED if is_secret_key(str(k)) and v not in (None, "") else redact_secrets(v))
            for k, v in data.items()
        }
    if isinstance(data, list | tuple):
        return type(data)(redact_secrets(v) for v in data)
    if isinstance(data, str):
        return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<3>", data)
    return data


_URL_PASSWORD_ANYWHERE = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]+:)([^@/\s'\"]+)(@)")


def secret_values(data: object) -> set[str]:
    """Every credential in ``data``: the values under credential-like keys and the passwords of
    ``scheme://user:password@host`` URLs (strings of 4 characters or more, so that masking
    them in free text cannot eat ordinary words)."""
    found: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if is_secret_key(str(key)) and isinstance(value, str | int) and value not in ("", None):
                found.add(str(value))
            else:
                found |= secret_values(value)
    elif isinstance(data, list | tuple):
        for value in data:
            found |= secret_values(value)
    elif isinstance(data, str):
        found |= {m.group(2) for m in _URL_PASSWORD_ANYWHERE.finditer(data)}
    return {s for s in found if len(s) >= 4}


def redact_text(text: str, secrets: set[str] | frozenset[str] = frozenset()) -> str:
    """``text`` (a console line, a log, an error message) with the password of every
    ``scheme://user:password@host`` URL in it masked and every string of ``secrets``
    (:func:`secret_values` of the recipe) replaced by ``REDACTED``."""
    text = _URL_PASSWORD_ANYWHERE.sub(rf"\g<1>{REDACTED}\g<3>", text)
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
