"""Under a derandomized profile a test draws from a seed named for what it checks, so editing its
body (a comment, a refactor) leaves its examples, and so its verdict, as they were."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.verdict import profiles, seeds
from conformance.verdict.clauses import count_examples


def _draws(test) -> list[int]:
    seen: list[int] = []
    test(seen)
    return seen


def _twins():
    """The same test twice, its body edited between: a comment and a renamed local."""

    @given(x=st.integers(0, 2**32))
    @settings(max_examples=10)
    def before(seen, x):
        seen.append(x)

    @given(x=st.integers(0, 2**32))
    @settings(max_examples=10)
    def after(seen, x):
        # a comment a refactor added
        value = x
        seen.append(value)

    return before, after


def test_a_body_edit_leaves_the_drawn_examples_unchanged() -> None:
    previous = settings.get_current_profile_name()
    try:
        profiles.load("ci")
        before, after = _twins()
        # Hypothesis alone seeds a derandomized test from its source: the edit changes the draws.
        assert _draws(before) != _draws(after)
        for test in (before, after):
            count_examples(test, seed_name="a-clause")  # one clause's test, before and after the edit
        assert _draws(before) == _draws(after)
        # Another clause draws other examples.
        count_examples(after, seed_name="another-clause")
        assert _draws(before) != _draws(after)
        profiles.load("dev")  # a random profile: no seed, fresh draws each run
        assert before._hypothesis_internal_use_seed is None
    finally:  # the profile this process had, and its seeds
        settings.load_profile(previous)
        seeds.apply(previous, derandomized=bool(settings.default.derandomize))


def test_seeds_are_named_for_the_clause_and_the_profile() -> None:
    assert seeds.seed_for("state_machine", "ci") == seeds.seed_for("state_machine", "ci")
    assert seeds.seed_for("state_machine", "ci") != seeds.seed_for("state_machine", "certify")
    assert seeds.seed_for("state_machine", "ci") != seeds.seed_for("no_aliasing", "ci")
