"""Saves a prompt when it is first scheduled, as vLLM's ExampleConnector does: under chunked prefill
that is the first chunk's blocks under the whole prompt's key, and a later lookup claims the whole
prompt (vLLM's ``test_example_connector_partial_save.py``)."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class EarlySaveConnector(LifecycleConnector):
    SAVE_COMPLETE = False
