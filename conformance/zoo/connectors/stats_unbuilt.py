"""Collects transfer statistics in its workers but never says how to rebuild them: its class keeps
the base ``build_kv_connector_stats``, which returns None. vLLM's scheduler carries the stats to the
frontend, whose logger drops them with a one-time warning: the connector's metrics never show."""

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from conformance.zoo.good.stats import StatsConnector


class UnbuiltStatsConnector(StatsConnector):
    build_kv_connector_stats = KVConnectorBase_V1.__dict__["build_kv_connector_stats"]
