"""MediaItem -> images through vLLM's own media loading (no multimodal model needed)."""

from __future__ import annotations

import base64
import io

import grpc
import pytest

from openengine_adapters.backend import Media
from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import Modality
from openengine_adapters.vllm.media import load_images

pytestmark = pytest.mark.asyncio(loop_scope="session")


def png(color=(200, 10, 10)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buf, format="PNG")
    return buf.getvalue()


async def test_raw_bytes_and_data_uri_become_rgb_images():
    data_uri = "data:image/png;base64," + base64.b64encode(png((0, 200, 0))).decode()
    images = await load_images([Media(Modality.IMAGE, raw_bytes=png()), Media(Modality.IMAGE, data_uri=data_uri)])
    assert [im.size for im in images] == [(4, 3), (4, 3)]
    assert images[0].getpixel((0, 0)) == (200, 10, 10) and images[1].getpixel((1, 1)) == (0, 200, 0)


async def test_undecodable_media_is_refused_before_acceptance():
    with pytest.raises(RequestRejected) as info:
        await load_images([Media(Modality.IMAGE, raw_bytes=b"not an image")])
    assert info.value.status == grpc.StatusCode.INVALID_ARGUMENT and "media[0]" in info.value.message
