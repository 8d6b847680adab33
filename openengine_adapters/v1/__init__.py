"""Generated openengine.v1 stubs (tools/gen_proto.py); do not edit."""
