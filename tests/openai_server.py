"""A small OpenAI-compatible `/v1/completions` server for tests, behaving as vLLM does:
the matched stop string is left out of the text and named in `stop_reason`. It generates
with a real (tiny) transformers model."""

from __future__ import annotations

import json
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from agent.backends.base import Sampling, TurnOutput


def create_app(backend) -> FastAPI:
    app = FastAPI()
    lock = threading.Lock()

    def complete(prompt: str | list[int], max_tokens: int, stops: list[str]):
        if isinstance(prompt, list):  # token ids (a left-cut context): back to their text
            prompt = backend.tokenizer.decode(prompt)
        with lock:
            *_, out = backend.stream([prompt], max_tokens, Sampling())
        assert isinstance(out, TurnOutput)
        text, stop_reason = out.text, None
        for stop in stops:
            if stop in text:
                text, stop_reason = text[: text.index(stop)], stop
                break
        finish = "length" if out.finish == "length" else "stop"
        return text, finish, stop_reason, out.new_tokens

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        text, finish, stop_reason, tokens = complete(body["prompt"], body["max_tokens"],
                                                     body.get("stop") or [])
        usage = {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}
        base = {"id": "cmpl-test", "object": "text_completion", "created": int(time.time()),
                "model": body["model"]}
        if not body.get("stream"):
            return {**base, "usage": usage, "choices": [
                {"index": 0, "text": text, "finish_reason": finish, "stop_reason": stop_reason,
                 "logprobs": None}]}

        def events():
            pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
            for piece in pieces:
                chunk = {**base, "choices": [{"index": 0, "text": piece, "finish_reason": None,
                                              "logprobs": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            last = {**base, "choices": [{"index": 0, "text": "", "finish_reason": finish,
                                         "stop_reason": stop_reason, "logprobs": None}]}
            yield f"data: {json.dumps(last)}\n\n"
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def serve_in_thread(backend, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(create_app(backend), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server
