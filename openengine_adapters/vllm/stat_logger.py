"""vLLM's stat-logger interface, feeding a StatsCollector (imported only where vLLM is)."""

from __future__ import annotations

import os

from vllm.v1.metrics.loggers import StatLoggerBase

from openengine_adapters.vllm.stats import SHARED, StatsCollector

PLUGIN_PORT_ENV = "OPENENGINE_GRPC_PORT"


class OpenEngineStatLogger(StatLoggerBase):
    """Also the ``vllm.stat_logger_plugins`` entry: created by vLLM with the engine, it records
    into the plugin's shared collector only when the plugin server is enabled."""

    def __init__(self, vllm_config, engine_index: int = 0, collector: StatsCollector | None = None):
        if collector is None and os.environ.get(PLUGIN_PORT_ENV):
            collector = SHARED
        self.collector = collector
        self.engine_index = engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if self.collector is not None:
            self.collector.record(scheduler_stats, iteration_stats, engine_idx)

    def log_engine_initialized(self) -> None:
        pass


def stat_logger_factory(collector: StatsCollector):
    """Pass as ``AsyncLLM(stat_loggers=[stat_logger_factory(collector)])``."""

    def factory(vllm_config, engine_index: int = 0) -> OpenEngineStatLogger:
        return OpenEngineStatLogger(vllm_config, engine_index, collector=collector)

    return factory
