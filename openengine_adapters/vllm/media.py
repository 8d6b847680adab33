"""MediaItem -> images for vLLM's multimodal prompt (the engine preprocesses them).

Every source goes through vLLM's own media loading, configured like vLLM's own servers configure
it for the engine (``VLLM_MEDIA_CONNECTOR``, ``--media-io-kwargs``, ``--allowed-media-domains``),
so an image is decoded the same way whichever way it came: URLs (http/https; fetch timeout,
redirect and domain policy), data URIs and raw bytes all give the same pixels (RGB, transparent
pixels composited on the configured background), under the same ``VLLM_MAX_IMAGE_PIXELS`` limit,
decoded off the event loop. Local files are never read. A media item that cannot be fetched or
decoded is refused before acceptance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from openengine_adapters.backend import Media
from openengine_adapters.errors import invalid


def media_connector(model_config: Any = None):
    """vLLM's media connector with the engine's media settings (defaults without a config)."""
    import vllm.envs as envs
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    mm_config = getattr(model_config, "multimodal_config", None)
    return MEDIA_CONNECTOR_REGISTRY.load(
        envs.VLLM_MEDIA_CONNECTOR,
        media_io_kwargs=getattr(mm_config, "media_io_kwargs", None) or None,
        allowed_local_media_path="",  # OpenEngine media are http(s) URLs, data URIs or bytes
        allowed_media_domains=getattr(model_config, "allowed_media_domains", None),
    )


async def load_images(media: Sequence[Media], connector: Any = None) -> list:
    from vllm.multimodal.media import ImageMediaIO

    connector = connector if connector is not None else media_connector()
    images = []
    for i, item in enumerate(media):
        try:
            if item.raw_bytes is not None:
                # as fetch_image_async decodes a fetched body or a data URI
                image_io = ImageMediaIO(**({"image_mode": "RGB"} | connector.media_io_kwargs.get("image", {})))
                images.append(await asyncio.to_thread(image_io.load_bytes, item.raw_bytes))
            else:
                images.append(await connector.fetch_image_async(item.url or item.data_uri))
        except Exception as exc:
            raise invalid(f"media[{i}]: the image could not be loaded: {exc}") from None
    return images
