"""Schema identity of the two contracts this package serves (both ``openengine.v1``, revision 1).

Revision 1 (service ``openengine.v1.OpenEngine``) is upstream's text at commit d0f29fe; v0.1.0
(services ``openengine.v1.Inference`` + ``openengine.v1.Control``) is upstream's released schema.
Both report ``schema_revision`` 1 and are told apart by ``schema_release``.
"""

SCHEMA_REVISION = 1
MINIMUM_CLIENT_REVISION = 1
# The immutable ai-dynamo/openengine commit holding revision 1 (never a moving branch name).
SCHEMA_RELEASE = "d0f29fec31f31db5cfd49cf3e0f67da84d10c709"

# v0.1.0: git tag v0.1.0 = b5f2bd93721f7b888d3e2440679e0ae7012939d1; upstream's ServerInfo reports
# the Buf registry module commit (as TensorRT-LLM's own server does).
V0_1_SCHEMA_RELEASE = "768a93c7b44e40f28c692ad0b471a8f2"
V0_1_GIT_TAG_COMMIT = "b5f2bd93721f7b888d3e2440679e0ae7012939d1"

# The wire surfaces a server can serve (``--surfaces``), by name.
SURFACES = ("revision-1", "v0.1.0")
