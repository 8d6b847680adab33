"""EngineInfo identity and revision fields."""

from __future__ import annotations

import re

from conformance.registry import check, expect
from openengine_adapters.v1 import engine_pb2

BRANCH_NAMES = {"main", "master", "develop", "development", "dev", "trunk", "head", "latest", "nightly",
                "stable", "release", "default", "origin/main", "origin/master", "refs/heads/main",
                "refs/heads/master"}


@check("identity.schema_revision", "always")
async def schema_revision(ctx):
    """schema_revision is exactly 1 (this contract's revision; zero is invalid)."""
    expect(ctx.engine_info.schema_revision == 1,
           f"schema_revision is {ctx.engine_info.schema_revision}, this suite tests revision 1")


@check("identity.minimum_client_revision", "always")
async def minimum_client_revision(ctx):
    """1 <= minimum_client_revision <= schema_revision."""
    info = ctx.engine_info
    expect(info.minimum_client_revision >= 1, f"minimum_client_revision is {info.minimum_client_revision}")
    expect(info.minimum_client_revision <= info.schema_revision,
           f"minimum_client_revision {info.minimum_client_revision} > schema_revision {info.schema_revision}")


@check("identity.schema_release", "always")
async def schema_release(ctx):
    """schema_release is a non-empty immutable tag/commit, not a moving branch name, stable across calls."""
    rel = ctx.engine_info.schema_release
    expect(rel.strip(), "schema_release is empty")
    expect(rel == rel.strip() and not re.search(r"\s", rel), f"schema_release {rel!r} contains whitespace")
    expect(rel.lower() not in BRANCH_NAMES and rel.lower().rsplit("/", 1)[-1] not in BRANCH_NAMES,
           f"schema_release {rel!r} is a moving branch name")
    again = await ctx.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=10)
    expect(again.schema_release == rel, f"schema_release changed between calls: {rel!r} -> {again.schema_release!r}")


@check("identity.engine_fields", "always")
async def engine_fields(ctx):
    """engine_name, a concrete role and at least one supported model are reported, and stay stable."""
    info = ctx.engine_info
    expect(info.engine_name, "engine_name is empty")
    expect(info.role != engine_pb2.ENGINE_ROLE_UNSPECIFIED, "role is ENGINE_ROLE_UNSPECIFIED")
    expect(list(info.supported_models), "supported_models is empty")
    expect(all(m for m in info.supported_models), "supported_models contains an empty name")
    expect(len(set(info.supported_models)) == len(info.supported_models), "supported_models has duplicates")
    again = await ctx.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=10)
    for f in ("engine_name", "engine_version", "role", "instance_id", "schema_revision",
              "minimum_client_revision"):
        expect(getattr(again, f) == getattr(info, f), f"EngineInfo.{f} changed between calls")
