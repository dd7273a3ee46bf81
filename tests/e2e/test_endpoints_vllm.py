"""Every endpoint a home app calls, through the gateway to real vLLM, with the official
clients: the OpenAI SDK's Responses API, the Anthropic SDK's messages, vLLM's own
conventions (/health, /tokenize, /detokenize, /v1/models), and the bodies Home Assistant
sends (tests/fixtures/home_apps)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import lasting
from tests.e2e.test_gateway_vllm import generated_tokens

pytestmark = pytest.mark.e2e

GEN = "tiny-llama"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "home_apps"


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a gateway counter's samples whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def leases_open(url: str) -> int:
    return int(httpx.get(url + "/status", timeout=30).json()["leases"]["open"])


def test_responses_non_streamed_as_vllm_answers_it(gateway_url: str, gen_worker_url: str) -> None:
    body: dict[str, Any] = {
        "input": "Turn on the kitchen light",
        "max_output_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }
    before = metric(gateway_url, "hearthgate_completion_tokens_total")
    via = sdk(gateway_url).responses.create(
        model=GEN,
        extra_body={"ignore_eos": True},
        **{k: v for k, v in body.items() if k != "ignore_eos"},
    )
    direct = sdk(gen_worker_url).responses.create(
        model=GEN,
        extra_body={"ignore_eos": True},
        **{k: v for k, v in body.items() if k != "ignore_eos"},
    )
    assert via.output_text == direct.output_text  # temperature 0: the same text
    assert via.usage is not None and direct.usage is not None
    assert (via.usage.input_tokens, via.usage.output_tokens) == (
        direct.usage.input_tokens,
        12,
    )
    # The gateway charged the output it read from the answer's usage.
    assert metric(gateway_url, "hearthgate_completion_tokens_total") - before == 12


def test_responses_streamed_through_the_sdk(gateway_url: str) -> None:
    before = metric(gateway_url, "hearthgate_completion_tokens_total")
    stream = sdk(gateway_url).responses.create(
        model=GEN,
        input=[{"role": "user", "content": "What is the weather?"}],
        max_output_tokens=10,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    kinds, text, final = [], [], None
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final is not None and final.usage is not None
    assert "".join(text) == final.output_text
    assert final.usage.output_tokens == 10
    assert metric(gateway_url, "hearthgate_completion_tokens_total") - before == 10
    assert leases_open(gateway_url) == 0


def test_stored_response_retrieved_followed_up_and_cancel_relayed(
    gateway_url: str, gen_worker_url: str
) -> None:
    client = sdk(gateway_url)
    first = client.responses.create(model=GEN, input="Remember: dinner at 7.", max_output_tokens=4)
    got = client.responses.retrieve(first.id)
    assert (got.id, got.output_text) == (first.id, first.output_text)
    follow = client.responses.create(
        model=GEN, input="When is dinner?", previous_response_id=first.id, max_output_tokens=4
    )
    assert follow.usage is not None and first.usage is not None
    # The worker prepended the stored conversation: the follow-up's prompt is longer.
    assert follow.usage.input_tokens > first.usage.input_tokens
    # Cancelling a finished response: the gateway passes on what vLLM itself answers.
    via = httpx.post(f"{gateway_url}/v1/responses/{first.id}/cancel", timeout=30)
    direct = httpx.post(f"{gen_worker_url}/v1/responses/{first.id}/cancel", timeout=30)
    assert via.status_code == direct.status_code
    assert via.headers["x-hearthgate-worker"] == "gen0"


def test_unknown_stored_response_is_answered_in_openais_shape(gateway_url: str) -> None:
    r = httpx.get(gateway_url + "/v1/responses/resp_does_not_exist", timeout=30)
    assert r.status_code == 404
    assert set(r.json()["error"]) >= {"message", "type", "code"}


def test_responses_client_that_leaves_gives_everything_back(
    gateway_url: str, gen_worker_url: str
) -> None:
    sized = lasting(gen_worker_url, {"model": GEN, "prompt": "x", "max_tokens": 3500}, 3.0, 1)
    body = {
        "model": GEN,
        "input": "Tell me a long story",
        "max_output_tokens": sized["max_tokens"],
        "stream": True,
        "ignore_eos": True,
    }
    before = generated_tokens(gen_worker_url)
    with httpx.stream("POST", gateway_url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if "response.output_text.delta" in line:
                break
    deadline = time.monotonic() + 10
    while leases_open(gateway_url):
        assert time.monotonic() < deadline, "the gateway kept the lease of a client that left"
        time.sleep(0.1)
    last = generated_tokens(gen_worker_url)
    while True:  # until vLLM stops producing
        time.sleep(1)
        now = generated_tokens(gen_worker_url)
        if now == last:
            break
        last = now
    assert last - before < 3500 / 2, "vLLM kept generating for a client that left"


def test_anthropic_messages_through_the_sdk(gateway_url: str) -> None:
    client = anthropic.Anthropic(base_url=gateway_url, api_key="unused", max_retries=0)
    message = client.messages.create(
        model=GEN,
        max_tokens=8,
        system="You are the house assistant.",
        messages=[{"role": "user", "content": "Lights off, please."}],
    )
    assert message.usage.output_tokens <= 8 and message.usage.input_tokens > 0
    before = metric(gateway_url, "hearthgate_completion_tokens_total")
    with client.messages.stream(
        model=GEN, max_tokens=6, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    charged = metric(gateway_url, "hearthgate_completion_tokens_total") - before
    assert charged == final.usage.output_tokens
    counted = client.messages.count_tokens(
        model=GEN, messages=[{"role": "user", "content": "hi there"}]
    )
    assert counted.input_tokens > 0


def test_vllm_conventions(gateway_url: str, gen_worker_url: str) -> None:
    health = httpx.get(gateway_url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    body = {"model": GEN, "prompt": "the family calendar"}
    via = httpx.post(gateway_url + "/tokenize", json=body).json()
    assert via == httpx.post(gen_worker_url + "/tokenize", json=body).json()
    back = httpx.post(gateway_url + "/detokenize", json={"model": GEN, "tokens": via["tokens"]})
    assert back.status_code == 200 and "calendar" in back.json()["prompt"]
    models = httpx.get(gateway_url + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny-llama", "minilm"]  # the settings' order
    direct = httpx.get(gen_worker_url + "/v1/models").json()["data"][0]
    assert models[0]["max_model_len"] == direct["max_model_len"]
    unknown = httpx.post(gateway_url + "/v1/audio/nothing", json={})
    assert unknown.status_code == 404 and "/v1/responses" in unknown.json()["error"]["message"]
    bad = httpx.post(gateway_url + "/tokenize", json={"model": "nope", "prompt": "x"})
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "name", ["ha_responses_stream", "ha_responses_stream_legacy", "ha_open_responses_stream"]
)
def test_home_assistant_turns_are_answered(gateway_url: str, name: str) -> None:
    """Home Assistant's conversation agent's bodies, as its source builds them."""
    sent = json.loads((FIXTURES / f"{name}.json").read_text())
    body = {**sent["body"], "model": GEN, "max_output_tokens": 8}
    with httpx.stream("POST", gateway_url + sent["path"], json=body, timeout=120) as r:
        text = r.read().decode()
    assert r.status_code == 200, text
    assert "event: response.completed" in text
