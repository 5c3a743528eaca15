"""A tiny OpenAI-compatible chat-completions server that answers from a script (offline tests).

``POST /v1/chat/completions`` (also ``/chat/completions``) answers with the next scripted reply:
either tool calls (``finish_reason: "tool_calls"``) or a text answer. Every request body is kept
in :attr:`StubLLM.requests`, so tests can check what the agent sent (system prompt, tools,
messages). Runs on a free loopback port in a daemon thread::

    with StubLLM([StubLLM.call("set_context", {"label": "memory", "content": "x"}), StubLLM.say("Done")]) as llm:
        ...  # point an OpenAI client at llm.base_url

``python -m tests.e2e.stub_llm`` serves the default script until Ctrl-C.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

Reply = dict[str, Any]

DEFAULT_FACT = "The user's favourite colour is teal."


class StubLLM:
    """Scripted OpenAI-compatible endpoint; replies are consumed in order, then ``fallback`` repeats."""

    def __init__(self, script: list[Reply] | None = None, *, fallback: str = "OK.") -> None:
        self.script = list(script) if script is not None else default_script()
        self.fallback = fallback
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @staticmethod
    def call(name: str, arguments: dict[str, Any]) -> Reply:
        """A scripted reply that calls one tool."""
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    @staticmethod
    def say(text: str) -> Reply:
        """A scripted final text answer."""
        return {"content": text}

    @staticmethod
    def slow(text: str, seconds: float) -> Reply:
        """A scripted text answer that arrives after ``seconds``."""
        return {"content": text, "delay": seconds}

    @staticmethod
    def trickle(text: str, pad: int, every_s: float) -> Reply:
        """A scripted text answer sent slowly: ``pad`` bytes of JSON whitespace first, one each
        ``every_s`` seconds (each read is quick; the whole answer is not), then the completion."""
        return {"content": text, "trickle": (pad, every_s)}

    @staticmethod
    def answer(body: Any) -> Reply:
        """A scripted 200 whose JSON body is ``body`` as given (a summarizer answering nonsense)."""
        return {"raw": body}

    @staticmethod
    def fail(status: int) -> Reply:
        """A scripted HTTP error (e.g. 503) instead of a completion."""
        return {"status": status}

    @property
    def base_url(self) -> str:
        """The OpenAI ``base_url`` (``http://127.0.0.1:<port>/v1``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _next(self, request: dict[str, Any]) -> tuple[int, Any, tuple[int, float]]:
        with self._lock:
            self.requests.append(request)
            reply = self.script.pop(0) if self.script else self.say(self.fallback)
            n = next(self._ids)
        if "delay" in reply:
            time.sleep(float(reply["delay"]))
        if "raw" in reply:
            return 200, reply["raw"], (0, 0.0)
        if "status" in reply:
            return int(reply["status"]), {"error": {"message": "scripted failure", "type": "server_error"}}, (0, 0.0)
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        finish = "stop"
        if reply.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": f"call_{n}_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(reply["tool_calls"])
            ]
            finish = "tool_calls"
        return (
            200,
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.get("model", "stub"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            },
            reply.get("trickle", (0, 0.0)),
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                length = int(self.headers.get("content-length") or 0)
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
                    return
                if not isinstance(request.get("messages"), list):
                    self._send(400, {"error": {"message": "messages is required", "type": "invalid_request_error"}})
                    return
                self._send(*stub._next(request))

            def _send(self, status: int, body: Any, trickle: tuple[int, float] = (0, 0.0)) -> None:
                pad, every_s = trickle
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(pad + len(data)))
                self.end_headers()
                try:
                    for _ in range(pad):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(every_s)
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def default_script() -> list[Reply]:
    """First a ``set_context`` call writing a fact to ``memory``, then a final answer."""
    return [
        StubLLM.call("set_context", {"label": "memory", "content": DEFAULT_FACT}),
        StubLLM.say("Noted: your favourite colour is teal."),
    ]


if __name__ == "__main__":
    with StubLLM() as llm:
        print(f"stub LLM at {llm.base_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
