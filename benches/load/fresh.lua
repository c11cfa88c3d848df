-- Every request a new messageId: each one executes (a task, an outbox event, a cache entry).
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
local function uuid4()
  local t = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx"
  return (t:gsub("[xy]", function(c)
    local v = (c == "x") and math.random(0, 15) or math.random(8, 11)
    return string.format("%x", v)
  end))
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["A2A-Extensions"] = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
request = function()
  local body = '{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":"'
    .. uuid4() .. '","role":"user","parts":[{"kind":"text","text":"load"}]},"metadata":{"durationMs":60000}}}'
  return wrk.format(nil, nil, nil, body)
end
