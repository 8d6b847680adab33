"""The wire surfaces served over the one core: ``revision1`` (service openengine.v1.OpenEngine)
and ``v0_1`` (the released upstream v0.1.0: openengine.v1.Inference + openengine.v1.Control)."""
