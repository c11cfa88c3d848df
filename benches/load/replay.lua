-- The same request every time: after the first, every response is a replay.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["A2A-Extensions"] = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":"6f1c2b8e-3d4a-4e5f-9a7b-0c1d2e3f4a5b","role":"user","parts":[{"kind":"text","text":"load"}]},"metadata":{"durationMs":60000}}}'
