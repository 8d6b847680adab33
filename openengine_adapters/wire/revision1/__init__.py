"""Revision 1's wire surface: service ``openengine.v1.OpenEngine`` (17 RPCs)."""

from openengine_adapters.wire.revision1.servicer import SERVICE, register

__all__ = ["SERVICE", "register"]
