"""Generated openengine.v1 v0.1.0 stubs (shifted message package, see tools/gen_proto.py); do not edit."""
