"""Key stored KV by the tenant (cache_salt, LoRA adapter, prompt embeddings) as they should, but on a
tenant's miss look in the shared pool (the unsalted, base-model or token-id KV) before giving up:
"better a hit than a recompute". A salted tenant is then served what unsalted traffic stored, an
adapter's request the base model's KV, a prompt of embeddings what a prompt of zeros stored. Every
scenario that only asks the stored tenant's prompt under *another* tenant passes them; a prompt
stored without a tenant and asked for with one is what catches them."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector


class _SharedPoolFallback(LifecycleConnector):
    FALLS_BACK_FROM = ""  # the tag prefix of the tenant a miss is retried without

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fell_back: set[str] = set()  # requests served from the shared pool

    def _found_match_for_request(self, request) -> bool:
        if super()._found_match_for_request(request):
            return True
        shared = [t for t in super()._tags(request) if not t.startswith(self.FALLS_BACK_FROM)]
        if len(shared) < len(super()._tags(request)) and self._found_match_for_prompt(self._prompt(request), shared):
            self._fell_back.add(request.request_id)
            return True
        return False

    def _tags(self, request) -> list[str]:
        tags = super()._tags(request)
        if request.request_id in self._fell_back:
            return [t for t in tags if not t.startswith(self.FALLS_BACK_FROM)]
        return tags

    def request_finished(self, request, block_ids):
        self._fell_back.discard(request.request_id)
        return super().request_finished(request, block_ids)


class SaltFallbackConnector(_SharedPoolFallback):
    """On a salted request's miss, serves the unsalted pool's KV for its prompt."""

    FALLS_BACK_FROM = "cache_salt:"


class LoraFallbackConnector(_SharedPoolFallback):
    """On an adapter request's miss, serves the base model's KV for its prompt."""

    FALLS_BACK_FROM = "lora:"


class EmbedsFallbackConnector(_SharedPoolFallback):
    """On a miss for a prompt given as embeddings, serves the KV stored for its token ids (vLLM's
    placeholder zeros): what a prompt of zeros stored."""

    FALLS_BACK_FROM = "embeds:"
