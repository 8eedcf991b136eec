"""Redaction by value: the secrets a run was configured with never reach a file it writes.

A secret is known by where it was configured, never guessed from the words around it in a text (an
error saying "missing key: 12" keeps its 12). Each process that reads configuration registers the
secrets in it (``register_*``): the values under secret-named keys, at any depth, of a connector's
extra config, a matrix cell's and PRODUCT.yaml; the values of secret-named ``KVCONFORM_*``
variables; URL passwords and secret-named query parameters inside any of those values; and every
value of a declared engine environment but ``SAFE_ENV_VALUES``. ``redact_text`` masks exactly those
values, longest first, wherever they appear, and beyond them only what is a secret by its shape: a
URL's password, the values of ``--kv-engine-env NAME=VALUE`` and the secret-named keys of a
``--kv-connector-extra-config`` JSON in a command line (a sink may print a child's command or output
with values this process never read). ``redact`` masks a mapping's secret-named keys by structure,
since a mapping is config. pytest-xdist workers, forked children and the matrix runner parse the
same options or command line, so each registers for itself.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Iterator, Mapping, Sequence
from urllib.parse import unquote

from conformance import vocabulary as options

REDACTED = "***"
# The engine environment a connector declares (--kv-engine-env NAME=VALUE) is the deployment's, and a
# value may be a credential whatever its name: recorded by name, the value only for these (no secret).
SAFE_ENV_VALUES = frozenset({"PYTHONHASHSEED"})
# A secret-looking name: of a mapping key, a query parameter or a KVCONFORM_* variable; it decides
# which values are secrets, and is never looked for in free text.
_SECRET_NAME = (r"(?<![a-z0-9])(?:(?:pass(?:word|wd)?|secrets?|tokens?|api[_-]?key|apikey|credentials?"
                r"|auth(?:orization|[_-]?token)?|private[_-]?key|access[_-]?key|secret[_-]access[_-]key|sas|sig"
                r"|signature)(?![a-z0-9])|key(?![a-z0-9_]))")
_SECRET_KEY = re.compile(_SECRET_NAME, re.I)
# URL user-info: everything between "scheme://user:" and the last "@" before the host (a password
# may hold "/" or ":"); masking too much is the safe side.
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s'\"]*):(?P<pw>[^\s'\"]+)@", re.I)
_QUERY_SECRET = re.compile(rf"[?&;][a-z0-9_.-]*?(?:{_SECRET_NAME})=(?P<value>[^&;#\s'\"]+)", re.I)
_ENGINE_ENV = re.compile(r"(?P<option>--kv-engine-env[= ]['\"]?)(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>[^\s'\"]*)")
_EXTRA_CONFIG = re.compile(rf"{re.escape(options.EXTRA_CONFIG)}[= ]'?")
_JSON = json.JSONDecoder()
ENV_PREFIX = "KVCONFORM_"
# Shorter values, numbers and booleans are settings, not credentials: masking one wherever it
# appears would take the text around it (every "1" of a log). ``redact`` still masks them under a
# secret-named key, and a command line's extra config by its keys.
MIN_SECRET_CHARS = 4
_PLAIN_VALUE = re.compile(r"[+-]?[\d.]+|true|false|yes|no|on|off|none|null", re.I)


class SecretValues:
    """The secret values this process knows, masked in every text it writes."""

    def __init__(self) -> None:
        self.values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, value: str) -> None:
        if len(value) >= MIN_SECRET_CHARS and not _PLAIN_VALUE.fullmatch(value) and value not in self.values:
            self.values.add(value)
            self._pattern = None

    def mask(self, text: str) -> str:
        """``text`` with every known value masked, the longest first (a secret holding another is masked whole)."""
        if not self.values:
            return text
        if self._pattern is None:
            self._pattern = re.compile("|".join(map(re.escape, sorted(self.values, key=len, reverse=True))))
        return self._pattern.sub(REDACTED, text)


KNOWN = SecretValues()


def is_secret_name(name: str) -> bool:
    """Whether ``name`` (a key, a query parameter, a variable) says its value is a secret."""
    return bool(_SECRET_KEY.search(name))


def _embedded(text: str) -> Iterator[str]:
    """The secrets inside a configured value: a URL's password (as written and decoded), the values of
    its secret-named query parameters."""
    for m in _URL_PASSWORD.finditer(text):
        yield from {m["pw"], unquote(m["pw"])}
    for m in _QUERY_SECRET.finditer(text):
        yield from {m["value"], unquote(m["value"])}


def _register_value(value: str, secret: bool) -> None:
    for found in ([value] if secret else []) + list(_embedded(value)):
        KNOWN.add(found)


def register_config(config: Any, secret: bool = False) -> None:
    """Register the secrets of a configuration (extra config, PRODUCT.yaml): every string under a
    secret-named key, at any depth (a mapping under one is secret whole), and what ``_embedded``
    finds in any string value."""
    if isinstance(config, dict):
        for k, v in config.items():
            register_config(v, secret or is_secret_name(str(k)))
    elif isinstance(config, (list, tuple)):
        for v in config:
            register_config(v, secret)
    elif isinstance(config, str):
        _register_value(config, secret)


def register_environment(environ: Mapping[str, str]) -> None:
    """Register the secrets of the ``KVCONFORM_*`` variables: a secret-named one's value, and what
    ``_embedded`` finds in any."""
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX):
            _register_value(value, is_secret_name(name.removeprefix(ENV_PREFIX)))


def register_engine_env(items: Iterable[str]) -> None:
    """Register the values of a declared engine environment (``NAME=VALUE`` each) but those named in
    ``SAFE_ENV_VALUES``: a deployment's variable may hold a credential whatever its name."""
    for item in items:
        name, sep, value = item.partition("=")
        if sep and name not in SAFE_ENV_VALUES:
            _register_value(value, True)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def register_options(extra_config: str | None, engine_env: Iterable[str] = (),
                     transfer_config: Iterable[str] = (), server_args: Iterable[str] = ()) -> None:
    """Register the secrets of the suite's connector options as given (unparsed: a malformed one is
    reported where it is parsed): its extra config, engine environment, transfer config fields
    (``FIELD=VALUE``) and LMCache server arguments."""
    if extra_config:
        register_config(_json_or_text(extra_config))
    register_engine_env(engine_env)
    for item in transfer_config:
        name, _, value = item.partition("=")
        register_config({name: _json_or_text(value)})
    for arg in server_args:
        register_config(_json_or_text(arg))


def register_args(args: Sequence[str]) -> None:
    """Register the secrets of a suite command line's connector options (``--opt=value`` or
    ``--opt value``): what a runner of the suite's child processes knows of their config."""
    given: dict[str, list[str]] = {}
    wanted = (options.EXTRA_CONFIG, options.ENGINE_ENV, options.TRANSFER_CONFIG, options.LMCACHE_SERVER_ARG)
    for i, arg in enumerate(args):
        name, sep, value = arg.partition("=")
        if name in wanted:
            given.setdefault(name, []).append(value if sep else (args[i + 1] if i + 1 < len(args) else ""))
    for extra in given.get(options.EXTRA_CONFIG, []):
        register_options(extra)
    register_options(None, given.get(options.ENGINE_ENV, []), given.get(options.TRANSFER_CONFIG, []),
                     given.get(options.LMCACHE_SERVER_ARG, []))


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a results file or report shows of a declared engine environment: every name, and the
    value of those in ``SAFE_ENV_VALUES`` (any other masked)."""
    return {name: value if name in SAFE_ENV_VALUES else REDACTED for name, value in env.items()}


def _mask_extra_config(text: str) -> str:
    """``text`` with the secret-named keys of each ``--kv-connector-extra-config`` JSON in it masked
    (whatever their values' length); JSON that does not parse there is left to ``KNOWN``."""
    out, at = [], 0
    for m in _EXTRA_CONFIG.finditer(text):
        if m.start() < at:
            continue
        try:
            config, end = _JSON.raw_decode(text, m.end())
        except ValueError:
            continue
        if isinstance(config, dict) and (masked := redact(config)) != config:
            out += [text[at:m.end()], json.dumps(masked)]
            at = end
    return "".join(out) + text[at:]


def redact_text(text: str) -> str:
    """``text`` with the known secrets masked, and what is a secret by its shape: URL passwords, the
    values of ``--kv-engine-env`` (``recorded_env``), a command line's extra config's secret keys."""
    text = _mask_extra_config(KNOWN.mask(text))
    text = _ENGINE_ENV.sub(lambda m: f"{m['option']}{m['name']}="
                           + (m["value"] if m["name"] in SAFE_ENV_VALUES else REDACTED), text)
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)


def redact(value: Any, key: str = "") -> Any:
    """``value`` with secrets masked: values under secret-named keys (a mapping is config), and in every
    other string what ``redact_text`` masks. Every sink the suite writes (results, cell commands, the
    pytest header, JUnit, reports, certification bundles) goes through it or ``redact_text``."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        if is_secret_name(key):
            return REDACTED
        return redact_text(value)
    return value
