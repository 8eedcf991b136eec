"""Hypothesis profiles: how hard the suite looks, named for who is looking.

* ``dev``: quick, random, with the example database, for a connector developer's loop.
* ``ci``: derandomized (the same examples every run), no deadline, failures print a blob.
* ``deep``: many random examples, for a nightly job or before a release.
* ``certify``: derandomized and larger than ci; the settings are recorded in the results so a
  certification run can be reproduced exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conformance.verdict import seeds

if TYPE_CHECKING:
    from hypothesis import settings

# The names are read without Hypothesis (matrix.yaml's validation runs in nox's own Python): it is
# imported where a profile is registered or loaded.
PROFILES: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 20, "stateful_step_count": 20},
    "ci": {"max_examples": 40, "derandomize": True, "print_blob": True, "database": None,
           "stateful_step_count": 30},
    "deep": {"max_examples": 600, "stateful_step_count": 60},
    "certify": {"max_examples": 120, "derandomize": True, "print_blob": True, "database": None,
                "stateful_step_count": 40},
}


# Profiles whose runs must end soon even when they fail: the connector level's examples are
# two engine lifetimes each (~0.1 s), and shrinking a failure there can take minutes. The first
# failing example is reported as found, with its seed (a certification run needs the verdict; the
# vendor shrinks under `dev`); `dev` and `deep` still shrink.
NO_SHRINK = ("ci", "certify")
# A profile's variant that never shrinks (``--kv-no-shrink``): for a run whose failures are expected,
# as a known-bad control's, where the first failing example found is all the report needs.
UNSHRUNK = "-no-shrink"


def _common() -> dict[str, Any]:
    """What every profile sets."""
    from hypothesis import HealthCheck

    return {"deadline": None,  # a store's first call may open files or sockets: timing is not a clause
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


def _no_shrink_phases() -> tuple[Any, ...]:
    from hypothesis import Phase

    return (Phase.explicit, Phase.reuse, Phase.generate)


def costly_example_settings(profile: str | None = None) -> settings:
    """Settings for tests whose examples are costly: the profile's, minus shrinking under ``NO_SHRINK``."""
    from hypothesis import settings

    register_profiles()  # idempotent; collection may import a level before the plugin loaded a profile
    if profile is None:  # the profile the plugin loaded; Hypothesis' own default counts as dev
        current = settings.get_current_profile_name()
        if current.endswith(UNSHRUNK) and current.removesuffix(UNSHRUNK) in PROFILES:
            return settings.get_profile(current)
        profile = current if current in PROFILES else "dev"
    base = settings.get_profile(profile)
    return settings(base, phases=_no_shrink_phases()) if profile in NO_SHRINK else base


def register_profiles() -> None:
    from hypothesis import settings

    for name, values in PROFILES.items():
        settings.register_profile(name, **_common(), **values)
        settings.register_profile(name + UNSHRUNK, **_common(), **values, phases=_no_shrink_phases())


def load(profile: str, shrink: bool = True) -> None:
    """Load ``profile`` (registered first), or its variant that reports failing examples unshrunk."""
    from hypothesis import settings

    register_profiles()
    settings.load_profile(profile if shrink else profile + UNSHRUNK)
    # Each test's draws then follow from its name, not its source: a body edits freely.
    seeds.apply(profile, derandomized=bool(PROFILES[profile].get("derandomize")))


def describe(name: str) -> str:
    values = PROFILES[name]
    return f"{name} (" + ", ".join(f"{k}={v}" for k, v in values.items()) + ")"


def recorded(chosen: settings) -> dict[str, Any]:
    """The settings a results file records of a run (what a certification's verifier compares)."""
    return {"max_examples": chosen.max_examples, "derandomize": chosen.derandomize,
            "stateful_step_count": chosen.stateful_step_count}
