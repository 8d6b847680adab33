"""Schema identity of the contract this package implements (openengine.v1, revision 1)."""

SCHEMA_REVISION = 1
MINIMUM_CLIENT_REVISION = 1
# The immutable ai-dynamo/openengine commit holding revision 1 (never a moving branch name).
SCHEMA_RELEASE = "d0f29fec31f31db5cfd49cf3e0f67da84d10c709"
