"""The engine-agnostic core both wire surfaces share: one request table, admission, drain,
health, stream assembly and the EngineService that runs every RPC on one EngineBackend."""
