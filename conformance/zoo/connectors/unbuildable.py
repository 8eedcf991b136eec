"""Cannot be built against this vLLM: its constructor fails the way LMCacheMPConnector of vLLM
0.20-0.21 does beside LMCache 0.4.7 (``ParallelStrategy.__init__() takes 6 positional arguments but 8
were given``). No engine with it ever starts, so no clause has anything to judge: each must be Not
runnable, never a Pass (``engine_lost_storage`` once passed it: "no output, so no wrong output")."""

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class UnbuildableConnector(ExampleConnector):
    def __init__(self, *args, **kwargs):
        raise TypeError("ParallelStrategy.__init__() takes 6 positional arguments but 8 were given")
