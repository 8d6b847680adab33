"""MediaItem -> PIL images for vLLM's multimodal prompt (the engine preprocesses them).

URLs (http/https) and data URIs go through vLLM's own ``MediaConnector`` (its fetch timeout,
no local-file access); raw bytes are decoded with PIL. A media item that cannot be fetched or
decoded is refused before acceptance.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from openengine_adapters.backend import Media
from openengine_adapters.errors import invalid


async def load_images(media: Sequence[Media]) -> list:
    from PIL import Image
    from vllm.multimodal.media import MediaConnector

    connector = MediaConnector()
    images = []
    for i, item in enumerate(media):
        try:
            if item.raw_bytes is not None:
                image = Image.open(io.BytesIO(item.raw_bytes))
                image.load()
                images.append(image.convert("RGB"))
            else:
                images.append(await connector.fetch_image_async(item.url or item.data_uri))
        except Exception as exc:
            raise invalid(f"media[{i}]: the image could not be loaded: {exc}") from None
    return images
