"""Generated openengine.v1 revision 1 stubs; do not edit."""
