"""The lifecycle control with a minimum span, as caches that store in large chunks are built: it
stores a prompt only once it has more than MIN_SPAN tokens (a shorter one is not worth a file) and
so serves only such prompts. Legal, and invisible to a suite whose prompts are all shorter: every
clause would compare nothing. Declared ``min-span=256``, every prompt the suite builds is 256
tokens longer (whole blocks) and each clause judges it. Its one-bug twin is
``connectors/min_span_salt_blind``, whose bug only long prompts reach."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector

MIN_SPAN = 256


class MinSpanConnector(LifecycleConnector):
    def _maybe_save(self, meta, rid: str, computed: int, scheduler_output, *, first: bool) -> None:
        if self._admitted[rid].num_prompt_tokens > MIN_SPAN:
            super()._maybe_save(meta, rid, computed, scheduler_output, first=first)
