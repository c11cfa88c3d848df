#!/usr/bin/env python3
"""Interop check: the official A2A Python SDK (a2a-sdk 1.3.0) against the example server.

Usage: python a2a_sdk_client.py http://127.0.0.1:PORT

Runs each scenario with the SDK's A2A 1.0 JSON-RPC client and with its A2A 0.3 compatibility
client (CompatJsonRpcTransport, chosen by the SDK for a card whose interface says 0.3):

- resolve the AgentCard and create the client through `ClientFactory`;
- send a message with a fixed messageId -> a Task; send the very same message again (the SDK
  gives it a new JSON-RPC id) -> the same Task, with `Idempotent-Replayed: true`;
- get the task by id;
- the same messageId with another payload -> rejected, and the original is kept;
- without the activation header -> rejected;
- `params.metadata.durationMs` as the SDK writes it (a protobuf Struct number: `200.0`) ->
  the mission completes, GetTask shows the echo artifact;
- stream a new message to the final event; stream it again -> the same events, replayed.

The activation header goes through the SDK's own per-call mechanism:
`ClientCallContext(service_parameters=...with_a2a_extensions([URI]))`, which the transports
turn into the `A2A-Extensions` HTTP header (the 0.3 transport mirrors it to
`X-A2A-Extensions`). The SDK hides HTTP responses, so a recording httpx transport under the
SDK's `httpx.AsyncClient` keeps every request and response (headers and body) for the checks.

Prints one line per check; exits 1 on any failure, with the HTTP exchange that shows it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from google.protobuf import json_format

from a2a.client import A2ACardResolver, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.client.service_parameters import ServiceParametersFactory, with_a2a_extensions
from a2a.compat.v0_3.versions import is_legacy_version
from a2a.types.a2a_pb2 import (
    AgentCard,
    AgentInterface,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)

URI = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
REPLAYED = "Idempotent-Replayed"
TERMINAL = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_REJECTED,
}
OVERALL_TIMEOUT_S = 120
MISSION_MS = 200


# ----------------------------------------------------------------------------------------------
# Recording every HTTP exchange under the SDK


@dataclass
class Exchange:
    method: str  # the JSON-RPC method, or "GET <path>"
    rpc_id: Any
    request_headers: httpx.Headers
    request_body: bytes
    status: int = 0
    response_headers: httpx.Headers = field(default_factory=httpx.Headers)
    chunks: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def sse_payloads(self) -> list[Any]:
        """The JSON of every SSE `data:` event of the response body."""
        out, data = [], []
        for line in self.body.decode("utf-8", "replace").splitlines():
            if not line.strip():
                if data:
                    out.append(json.loads("\n".join(data)))
                data = []
            elif line.startswith("data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(" ") else value)
        if data:
            out.append(json.loads("\n".join(data)))
        return out

    def describe(self) -> str:
        req_h = "\n".join(f"  {k}: {v}" for k, v in self.request_headers.items())
        res_h = "\n".join(f"  {k}: {v}" for k, v in self.response_headers.items())
        body = self.body.decode("utf-8", "replace")
        if len(body) > 4000:
            body = body[:4000] + "…(cut)"
        return (
            f"--- request {self.method} (JSON-RPC id {self.rpc_id!r})\n{req_h}\n"
            f"  {self.request_body.decode('utf-8', 'replace')}\n"
            f"--- response HTTP {self.status}\n{res_h}\n  {body}"
        )


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, sink: list[bytes]):
        self._inner, self._sink = inner, sink

    async def __aiter__(self):
        async for chunk in self._inner:
            self._sink.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class RecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = request.content if isinstance(request.stream, httpx.ByteStream) else b""
        method, rpc_id = f"{request.method} {request.url.path}", None
        if body:
            try:
                payload = json.loads(body)
                method, rpc_id = payload.get("method", method), payload.get("id")
            except ValueError:
                pass
        ex = Exchange(method, rpc_id, request.headers.copy(), body)
        self.exchanges.append(ex)
        response = await self._inner.handle_async_request(request)
        ex.status, ex.response_headers = response.status_code, response.headers.copy()
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Tee(response.stream, ex.chunks),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


# ----------------------------------------------------------------------------------------------
# Checks


class CheckFailed(Exception):
    pass


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def ok(self, label: str, what: str) -> None:
        self.passed += 1
        print(f"ok   [{label}] {what}", flush=True)

    def fail(self, label: str, what: str) -> None:
        self.failed += 1
        print(f"FAIL [{label}] {what}", flush=True)


def check(cond: bool, what: str, *exchanges: Exchange | None) -> None:
    if not cond:
        detail = "\n".join(e.describe() for e in exchanges if e is not None)
        raise CheckFailed(what + ("\n" + detail if detail else ""))


def dump(msg) -> dict:
    return json_format.MessageToDict(msg)


def header_values(headers: httpx.Headers, name: str) -> set[str]:
    return {v.strip() for raw in headers.get_list(name) for v in raw.split(",") if v.strip()}


class Scenario:
    """One client flavour (A2A 1.0 or the 0.3 compatibility client) against the server."""

    def __init__(self, label: str, base_url: str, report: Report):
        self.label, self.base_url, self.report = label, base_url, report
        self.recorder = RecordingTransport()
        self.http = httpx.AsyncClient(transport=self.recorder, timeout=30.0)
        self.legacy = label == "0.3"
        self.card: AgentCard | None = None
        self.ctx = ClientCallContext(
            service_parameters=ServiceParametersFactory.create([with_a2a_extensions([URI])])
        )

    def ok(self, what: str) -> None:
        self.report.ok(self.label, what)

    async def step(self, name: str, coro) -> bool:
        try:
            await coro
            return True
        except CheckFailed as e:
            self.report.fail(self.label, f"{name}: {e}")
        except Exception as e:  # the SDK raised: show it and the last exchange
            last = self.recorder.exchanges[-1].describe() if self.recorder.exchanges else ""
            self.report.fail(
                self.label,
                f"{name}: the SDK raised {type(e).__name__}: {e}\n"
                + "".join(traceback.format_exception_only(type(e), e)).rstrip()
                + ("\n" + last if last else ""),
            )
        return False

    def last(self, method: str) -> Exchange:
        for ex in reversed(self.recorder.exchanges):
            if ex.method == method:
                return ex
        raise CheckFailed(f"no {method} request was sent by the SDK")

    @property
    def send_method(self) -> str:
        return "message/send" if self.legacy else "SendMessage"

    @property
    def stream_method(self) -> str:
        return "message/stream" if self.legacy else "SendStreamingMessage"

    def client(self, streaming: bool):
        assert self.card is not None
        config = ClientConfig(httpx_client=self.http, streaming=streaming)
        return ClientFactory(config).create(self.card)

    @staticmethod
    def request(message_id: str, text: str) -> SendMessageRequest:
        return SendMessageRequest(
            message=Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])
        )

    # -- the card ---------------------------------------------------------------------------

    async def resolve_card(self) -> None:
        card = await A2ACardResolver(self.http, self.base_url).get_agent_card()
        ex = self.last("GET /.well-known/agent-card.json")
        ext = [e for e in card.capabilities.extensions if e.uri == URI]
        check(len(ext) == 1, f"the card declares the extension {URI}", ex)
        check(ext[0].required, "the card declares the extension required: true", ex)
        if not self.legacy:
            ifaces = [
                i for i in card.supported_interfaces
                if i.protocol_binding == "JSONRPC" and not is_legacy_version(i.protocol_version)
            ]
            check(bool(ifaces), "supportedInterfaces has a JSONRPC 1.0 interface", ex)
            self.card = card
            self.ok(
                f"A2ACardResolver: card {card.name!r}, 1.0 JSONRPC interface {ifaces[0].url} "
                f"(protocolVersion {ifaces[0].protocol_version})"
            )
            return
        # A 0.3 client: the card as the SDK reads a 0.3 card (url, protocolVersion,
        # preferredTransport), without the 1.0 supportedInterfaces.
        raw = json.loads(ex.body)
        check(
            all(k in raw for k in ("url", "protocolVersion")),
            "the card has the 0.3 fields url and protocolVersion",
            ex,
        )
        raw.pop("supportedInterfaces", None)
        preferred = raw.get("preferredTransport", "-")
        card = parse_agent_card(raw)
        ifaces = list(card.supported_interfaces)
        check(
            len(ifaces) >= 1 and is_legacy_version(ifaces[0].protocol_version)
            and ifaces[0].protocol_binding == "JSONRPC",
            f"the 0.3 fields make a 0.3 JSONRPC interface (got {[dump(i) for i in ifaces]})",
            ex,
        )
        self.card = card
        self.ok(
            f"card read as A2A 0.3 (url {ifaces[0].url}, protocolVersion "
            f"{ifaces[0].protocol_version}, preferredTransport {preferred})"
        )

    # -- message/send -----------------------------------------------------------------------

    async def send(self, client, req: SendMessageRequest, ctx=None):
        ctx = ctx if ctx is not None else self.ctx
        events = [e async for e in client.send_message(req, context=ctx)]
        ex = self.last(self.send_method)
        check(len(events) == 1, f"one result from {self.send_method}, got {len(events)}", ex)
        check(events[0].HasField("task"), "the result is a Task", ex)
        return events[0].task, ex

    def check_exchange(self, ex: Exchange, replayed: bool) -> None:
        sent = header_values(ex.request_headers, "A2A-Extensions")
        check(URI in sent, "the SDK sent A2A-Extensions with the URI", ex)
        if self.legacy:
            check(
                URI in header_values(ex.request_headers, "X-A2A-Extensions"),
                "the 0.3 SDK client sent X-A2A-Extensions",
                ex,
            )
            check(ex.request_headers.get("A2A-Version") == "0.3", "A2A-Version: 0.3 sent", ex)
        else:
            check(ex.request_headers.get("A2A-Version") == "1.0", "A2A-Version: 1.0 sent", ex)
        check(ex.status == 200, f"HTTP 200 (got {ex.status})", ex)
        check(
            URI in header_values(ex.response_headers, "A2A-Extensions"),
            "the response echoes A2A-Extensions with the URI",
            ex,
        )
        got = ex.response_headers.get(REPLAYED)
        if replayed:
            check(got == "true", f"{REPLAYED}: true on the replay (got {got!r})", ex)
        else:
            check(got is None, f"no {REPLAYED} header on a first execution (got {got!r})", ex)

    def check_rpc_ids(self, ex: Exchange, payloads: list[Any]) -> None:
        for p in payloads:
            check(
                p.get("id") == ex.rpc_id,
                f"the JSON-RPC response id {p.get('id')!r} is the request's id {ex.rpc_id!r}",
                ex,
            )

    async def send_and_replay(self) -> None:
        client = self.client(streaming=False)
        message_id = str(uuid.uuid4())
        text = f"interop {self.label}: hello"

        task1, ex1 = await self.send(client, self.request(message_id, text))
        check(ex1.method == self.send_method, f"the SDK called {self.send_method}", ex1)
        self.check_exchange(ex1, replayed=False)
        self.check_rpc_ids(ex1, [json.loads(ex1.body)])
        self.ok(
            f"{self.send_method} messageId={message_id} -> Task {task1.id} "
            f"({TaskState.Name(task1.status.state)})"
        )

        task2, ex2 = await self.send(client, self.request(message_id, text))
        check(ex2 is not ex1 and ex2.rpc_id != ex1.rpc_id, "the retry has a new JSON-RPC id", ex2)
        self.check_exchange(ex2, replayed=True)
        self.check_rpc_ids(ex2, [json.loads(ex2.body)])
        check(task2.id == task1.id, f"the replay has the same task id ({task2.id})", ex1, ex2)
        check(dump(task2) == dump(task1), "the replayed Task equals the first one", ex1, ex2)
        self.ok(f"same message again (new JSON-RPC id) -> same Task, {REPLAYED}: true")

        got = await client.get_task(GetTaskRequest(id=task1.id), context=self.ctx)
        exg = self.last("tasks/get" if self.legacy else "GetTask")
        check(got.id == task1.id, f"GetTask returns the task ({got.id})", exg)
        check(got.context_id == task1.context_id, "GetTask: same contextId", exg)
        check(
            any(m.message_id == message_id for m in got.history),
            "GetTask: the history holds our message",
            exg,
        )
        check(exg.response_headers.get(REPLAYED) is None, f"GetTask has no {REPLAYED}", exg)
        self.ok(f"{exg.method} {task1.id} -> {TaskState.Name(got.status.state)}")

        # Same messageId, other payload: rejected, and the original stays cached.
        error, exc = await self.send_rejected(
            client, self.request(message_id, text + " (changed)"), self.ctx,
            "a reused messageId with another payload is rejected",
        )
        err = (json.loads(exc.body) if exc.body else {}).get("error") or {}
        check(exc.status == 422, f"HTTP 422 for a reused messageId (got {exc.status})", exc)
        check(err.get("code") == -32422, "JSON-RPC error -32422", exc)
        check(
            (err.get("data") or {}).get("code") == "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
            "error.data.code IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
            exc,
        )
        self.ok(
            f"reused messageId, other payload -> HTTP 422 / -32422 "
            f"(the SDK raises {type(error).__name__}: {error})"
        )
        task3, ex3 = await self.send(client, self.request(message_id, text))
        self.check_exchange(ex3, replayed=True)
        check(dump(task3) == dump(task1), "the original response is still the cached one", ex3)
        self.ok("the original message still replays after the conflict")

        # Without the activation header: the required extension rejects it.
        error, exn = await self.send_rejected(
            client, self.request(str(uuid.uuid4()), text), ClientCallContext(),
            "a send without the activation header is rejected",
        )
        check(
            not header_values(exn.request_headers, "A2A-Extensions"),
            "no activation header sent",
            exn,
        )
        err = (json.loads(exn.body) if exn.body else {}).get("error") or {}
        check(err.get("code") == -32008, "JSON-RPC error -32008", exn)
        self.ok(
            f"no activation header -> HTTP {exn.status} / -32008 "
            f"(the SDK raises {type(error).__name__}: {error})"
        )

    async def send_rejected(self, client, req, ctx, what: str) -> tuple[Exception, Exchange]:
        """Sends a request that the server must refuse; returns what the SDK raised."""
        try:
            await self.send(client, req, ctx)
        except CheckFailed:
            raise
        except Exception as e:  # the SDK's error for the refusal
            return e, self.last(self.send_method)
        check(False, what, self.last(self.send_method))
        raise AssertionError("unreachable")

    async def mission_completes(self) -> None:
        """`params.metadata` as the SDK writes it (a protobuf Struct: every number is a double,
        so `durationMs: 200` goes out as `200.0`), then GetTask until the mission completes."""
        client = self.client(streaming=False)
        message_id = str(uuid.uuid4())
        text = f"interop {self.label}: short mission"
        req = self.request(message_id, text)
        req.metadata.update({"durationMs": MISSION_MS})
        task, ex = await self.send(client, req)
        self.check_exchange(ex, replayed=False)
        deadline = time.monotonic() + 10
        while True:
            got = await client.get_task(GetTaskRequest(id=task.id), context=self.ctx)
            if got.status.state in TERMINAL or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        exg = self.last("tasks/get" if self.legacy else "GetTask")
        check(
            got.status.state == TaskState.TASK_STATE_COMPLETED,
            f"the mission completed (state {TaskState.Name(got.status.state)})",
            exg,
        )
        echoed = [p.text for a in got.artifacts for p in a.parts if p.text]
        check(text in echoed, f"an artifact echoes the text (artifacts {echoed})", exg)
        sent = json.loads(ex.request_body)["params"]["metadata"]["durationMs"]
        self.ok(f"metadata durationMs={MISSION_MS} (sent as {sent!r}) -> completed, echo artifact")

    # -- message/stream ---------------------------------------------------------------------

    async def stream(self, client, req: SendMessageRequest):
        events = [e async for e in client.send_message(req, context=self.ctx)]
        ex = self.last(self.stream_method)
        return events, ex

    @staticmethod
    def final_state(events: list[StreamResponse]):
        last = events[-1]
        if last.HasField("task"):
            return last.task.status.state
        if last.HasField("status_update"):
            return last.status_update.status.state
        return None

    async def stream_and_replay(self) -> None:
        check(
            self.card is not None and self.card.capabilities.streaming,
            "the card declares capabilities.streaming",
        )
        client = self.client(streaming=True)
        message_id = str(uuid.uuid4())
        text = f"interop {self.label}: stream"

        events1, ex1 = await self.stream(client, self.request(message_id, text))
        check(ex1.method == self.stream_method, f"the SDK called {self.stream_method}", ex1)
        self.check_exchange(ex1, replayed=False)
        check(
            ex1.response_headers.get("content-type", "").startswith("text/event-stream"),
            "Content-Type: text/event-stream",
            ex1,
        )
        check(len(events1) >= 1, "at least one event", ex1)
        check(events1[0].HasField("task"), "the stream starts with the Task", ex1)
        state = self.final_state(events1)
        check(state in TERMINAL, f"the last event is terminal (got {state})", ex1)
        self.check_rpc_ids(ex1, ex1.sse_payloads())
        task_id = events1[0].task.id
        kinds = [e.WhichOneof("payload") for e in events1]
        self.ok(
            f"{self.stream_method} messageId={message_id} -> {len(events1)} events {kinds}, "
            f"final {TaskState.Name(state)}"
        )

        events2, ex2 = await self.stream(client, self.request(message_id, text))
        check(ex2 is not ex1 and ex2.rpc_id != ex1.rpc_id, "the retry has a new JSON-RPC id", ex2)
        self.check_exchange(ex2, replayed=True)
        self.check_rpc_ids(ex2, ex2.sse_payloads())
        check(
            [dump(e) for e in events2] == [dump(e) for e in events1],
            "the replayed events equal the first stream's",
            ex1,
            ex2,
        )
        self.ok(f"same stream again -> the same {len(events2)} events, {REPLAYED}: true")

        got = await client.get_task(GetTaskRequest(id=task_id), context=self.ctx)
        exg = self.last("tasks/get" if self.legacy else "GetTask")
        check(got.id == task_id, "GetTask finds the streamed task", exg)
        check(got.status.state == state, "GetTask: the streamed final state", exg)
        self.ok(f"{exg.method} {task_id} -> {TaskState.Name(got.status.state)}")

    async def run(self) -> None:
        try:
            if not await self.step("card", self.resolve_card()):
                return
            await self.step("send", self.send_and_replay())
            await self.step("mission", self.mission_completes())
            await self.step("stream", self.stream_and_replay())
        finally:
            await self.http.aclose()


async def main(base_url: str) -> int:
    report = Report()
    started = time.monotonic()
    for label in ("1.0", "0.3"):
        await Scenario(label, base_url, report).run()
    print(
        f"a2a-sdk interop summary: {report.passed} checks ok, {report.failed} failed "
        f"({time.monotonic() - started:.1f}s)",
        flush=True,
    )
    return 1 if report.failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} http://HOST:PORT", file=sys.stderr)
        sys.exit(2)
    try:
        code = asyncio.run(asyncio.wait_for(main(sys.argv[1]), OVERALL_TIMEOUT_S))
    except asyncio.TimeoutError:
        print(f"FAIL the checks did not finish within {OVERALL_TIMEOUT_S}s", flush=True)
        code = 1
    sys.exit(code)
