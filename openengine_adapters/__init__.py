"""OpenEngine Adapters: the openengine.v1 gRPC contract served on vLLM, SGLang and TensorRT-LLM."""

__version__ = "0.1.0"
