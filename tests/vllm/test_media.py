"""Media (images) through gRPC on the REAL vLLM engine (CPU), with a tiny random-weight BLIP-2
built at test time, checked against a transformers forward pass of the same weights; plus the
media loading on its own.

BLIP-2 because, with vLLM 0.32 and no torchvision, the LLaVA family and PaliGemma fail to load
(their vLLM code imports transformers' torchvision-only Pixtral image processor). Its prompt holds
no placeholder: the processor puts ``num_query_tokens`` image tokens in front of the prompt.
"""

from __future__ import annotations

import base64
import http.server
import io
import threading

import grpc
import pytest
import pytest_asyncio
from conftest import engine_args, serve_vllm
from helpers import collect, expect_status
from stream_contract import check_generate_stream

from openengine_adapters.backend import Media
from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import Modality
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, model_pb2
from openengine_adapters.vllm.media import load_images

pytestmark = pytest.mark.asyncio(loop_scope="session")
PROMPT = "Question: what is in the picture? Answer:"
NUM_QUERY_TOKENS = 8  # build_tiny_blip2's default: the image's placeholder tokens


def png(color=(200, 10, 10), size=(4, 3)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def noise_png(seed: int, size=(60, 40)) -> bytes:
    """A seeded random RGB image (not square: the processor resizes it)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# ------------------------------------------------------------------ media loading alone


async def test_raw_bytes_and_data_uri_become_rgb_images():
    images = await load_images([Media(Modality.IMAGE, raw_bytes=png()),
                                Media(Modality.IMAGE, data_uri=data_uri(png((0, 200, 0))))])
    assert [im.size for im in images] == [(4, 3), (4, 3)]
    assert images[0].getpixel((0, 0)) == (200, 10, 10) and images[1].getpixel((1, 1)) == (0, 200, 0)


async def test_undecodable_media_is_refused_before_acceptance():
    with pytest.raises(RequestRejected) as info:
        await load_images([Media(Modality.IMAGE, raw_bytes=b"not an image")])
    assert info.value.status == grpc.StatusCode.INVALID_ARGUMENT and "media[0]" in info.value.message


def rgba_png(size=(60, 40)) -> bytes:
    """Left half opaque noise, right half fully transparent black."""
    import numpy as np
    from PIL import Image

    pixels = np.zeros((size[1], size[0], 4), dtype=np.uint8)
    pixels[:, : size[0] // 2, :3] = np.random.RandomState(7).randint(0, 256, (size[1], size[0] // 2, 3))
    pixels[:, : size[0] // 2, 3] = 255
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(buf, format="PNG")
    return buf.getvalue()


async def test_raw_bytes_decode_like_a_data_uri():
    """Transparent pixels are composited on white (vLLM's default) whichever way they came."""
    raw, uri = await load_images([Media(Modality.IMAGE, raw_bytes=rgba_png()),
                                  Media(Modality.IMAGE, data_uri=data_uri(rgba_png()))])
    assert raw.mode == uri.mode == "RGB"
    assert raw.getpixel((59, 0)) == uri.getpixel((59, 0)) == (255, 255, 255)
    assert list(raw.getdata()) == list(uri.getdata())


# ------------------------------------------------------------------ end to end


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vllm(mm_model_dir):
    # the engine's media policy applies to gRPC media too: only 127.0.0.1 may be fetched
    args = engine_args(mm_model_dir, max_model_len=256, allowed_media_domains=["127.0.0.1"])
    async with serve_vllm(args) as s:
        yield s


@pytest.fixture(scope="module")
def images_server():
    """PNGs served over http on 127.0.0.1 (path -> bytes)."""
    files: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.files = files
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def mm_reference(mm_model_dir):
    """transformers' BLIP-2 on the same weights: greedy continuation of (image, prompt)."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, Blip2ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(mm_model_dir)
    model = Blip2ForConditionalGeneration.from_pretrained(mm_model_dir, dtype=torch.float32).eval()

    class Ref:
        @staticmethod
        def greedy(image_bytes: bytes, prompt: str, n: int) -> list[int]:
            image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
            inputs = processor(images=[image], text=prompt, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            return out[0, -n:].tolist()

    return Ref


def image_request(*media, prompt=PROMPT, max_tokens=8, **kw):
    return g.GenerateRequest(prompt=prompt, media=list(media), sampling=g.SamplingParams(temperature=0.0),
                             stopping=g.StoppingOptions(max_tokens=max_tokens, ignore_eos=True), **kw)


def image(**source) -> input_pb2.MediaItem:
    return input_pb2.MediaItem(modality=input_pb2.MODALITY_IMAGE, **source)


async def run(stub, req):
    return check_generate_stream(req, await collect(stub, req, timeout=120))


async def text_only_prompt_tokens(vllm) -> int:
    s = await run(vllm.stub, image_request(max_tokens=1))
    return s.usage.prompt_tokens


async def test_model_info_advertises_multimodal(vllm):
    info = await vllm.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    assert info.HasField("supports_multimodal") and info.supports_multimodal is True
    from manifest_check import check_manifest

    met = {"generate.media", "generate.cache_salt", "generate.bypass_prefix_cache", "score.label_tokens"}
    assert check_manifest(info, met) >= 20


async def test_image_as_raw_bytes_data_uri_and_url_reaches_the_model(vllm, images_server):
    data = noise_png(1)
    images_server.files["/one.png"] = data
    text_tokens = await text_only_prompt_tokens(vllm)
    results = []
    for source in ({"raw_bytes": data}, {"data_uri": data_uri(data)}, {"url": images_server.url + "/one.png"}):
        s = await run(vllm.stub, image_request(image(**source)))
        assert s.usage.prompt_tokens == text_tokens + NUM_QUERY_TOKENS, source.keys()
        assert s.usage.completion_tokens == 8 and len(s.token_ids[0]) == 8
        results.append(s.token_ids[0])
    assert results[0] == results[1] == results[2]  # the same pixels, however they came


async def test_pixels_decide_the_output(vllm):
    a, b = noise_png(1), noise_png(2)
    out_a1 = (await run(vllm.stub, image_request(image(raw_bytes=a)))).token_ids[0]
    out_b = (await run(vllm.stub, image_request(image(raw_bytes=b)))).token_ids[0]
    out_a2 = (await run(vllm.stub, image_request(image(raw_bytes=a)))).token_ids[0]
    out_text = (await run(vllm.stub, image_request())).token_ids[0]
    assert out_a1 == out_a2
    assert out_a1 != out_b
    assert out_text not in (out_a1, out_b)


async def test_greedy_matches_transformers(vllm, mm_reference):
    for seed in (1, 2):
        data = noise_png(seed)
        s = await run(vllm.stub, image_request(image(raw_bytes=data)))
        assert s.token_ids[0] == mm_reference.greedy(data, PROMPT, 8), seed


async def test_concurrent_image_requests_keep_their_own_images(vllm):
    import asyncio

    datas = [noise_png(seed) for seed in (1, 2, 3)]
    alone = [(await run(vllm.stub, image_request(image(raw_bytes=d)))).token_ids[0] for d in datas]
    together = await asyncio.gather(*(run(vllm.stub, image_request(image(raw_bytes=d))) for d in datas))
    assert [s.token_ids[0] for s in together] == alone


async def test_token_ids_prompt_with_image(vllm):
    from transformers import AutoTokenizer

    data = noise_png(1)
    by_text = await run(vllm.stub, image_request(image(raw_bytes=data)))
    ids = AutoTokenizer.from_pretrained(vllm.backend.engine.model_config.model)(PROMPT)["input_ids"]
    req = g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=ids), media=[image(raw_bytes=data)],
                            sampling=g.SamplingParams(temperature=0.0),
                            stopping=g.StoppingOptions(max_tokens=8, ignore_eos=True))
    by_ids = await run(vllm.stub, req)
    assert by_ids.token_ids[0] == by_text.token_ids[0]
    assert by_ids.usage.prompt_tokens == len(ids) + NUM_QUERY_TOKENS


async def test_unspecified_modality_is_an_image(vllm):
    data = noise_png(1)
    as_image = await run(vllm.stub, image_request(image(raw_bytes=data)))
    item = input_pb2.MediaItem(raw_bytes=data)  # MODALITY_UNSPECIFIED: treated as an image
    s = await run(vllm.stub, image_request(item))
    assert s.token_ids[0] == as_image.token_ids[0]


async def test_non_image_modality_is_rejected_before_any_event(vllm):
    for modality in (input_pb2.MODALITY_VIDEO, input_pb2.MODALITY_AUDIO):
        item = input_pb2.MediaItem(modality=modality, raw_bytes=noise_png(1))
        await expect_status(vllm.stub.Generate(image_request(item)), grpc.StatusCode.INVALID_ARGUMENT, "media[0]")


async def test_undecodable_image_is_rejected_before_any_event(vllm, images_server):
    images_server.files["/junk.png"] = b"not an image at all"
    for source in ({"raw_bytes": b"not an image at all"},
                   {"data_uri": "data:image/png;base64," + base64.b64encode(b"junk").decode()},
                   {"url": images_server.url + "/junk.png"},
                   {"url": images_server.url + "/missing.png"}):
        await expect_status(vllm.stub.Generate(image_request(image(**source))), grpc.StatusCode.INVALID_ARGUMENT,
                            "media[0]")
    # the engine still serves images afterwards
    s = await run(vllm.stub, image_request(image(raw_bytes=noise_png(1)), max_tokens=2))
    assert len(s.token_ids[0]) == 2


async def test_more_images_than_the_model_takes_are_rejected_before_any_event(vllm):
    two = [image(raw_bytes=noise_png(1)), image(raw_bytes=noise_png(2))]  # BLIP-2: one image per prompt
    await expect_status(vllm.stub.Generate(image_request(*two)), grpc.StatusCode.INVALID_ARGUMENT, "media")


async def test_transparent_image_gives_the_same_output_from_every_source(vllm, images_server):
    data = rgba_png()
    images_server.files["/rgba.png"] = data
    outs = [(await run(vllm.stub, image_request(image(**source)))).token_ids[0]
            for source in ({"raw_bytes": data}, {"data_uri": data_uri(data)},
                           {"url": images_server.url + "/rgba.png"})]
    assert outs[0] == outs[1] == outs[2]


async def test_engine_media_domain_policy_applies(vllm, images_server):
    images_server.files["/one.png"] = noise_png(1)
    port = images_server.server_address[1]
    await expect_status(vllm.stub.Generate(image_request(image(url=f"http://localhost:{port}/one.png"))),
                        grpc.StatusCode.INVALID_ARGUMENT, "media[0]")
    s = await run(vllm.stub, image_request(image(url=f"http://127.0.0.1:{port}/one.png"), max_tokens=2))
    assert len(s.token_ids[0]) == 2
