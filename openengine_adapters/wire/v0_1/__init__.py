"""The released upstream v0.1.0 wire surface: ``openengine.v1.Inference`` + ``openengine.v1.Control``."""

from openengine_adapters.wire.v0_1.servicers import CONTROL, INFERENCE, register

__all__ = ["CONTROL", "INFERENCE", "register"]
