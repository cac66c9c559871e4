-- wrk script: each request creates a new Pod with a name unique across threads and runs.
local token = os.getenv("TOKEN")
local threads = 0

function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

function init(args)
  counter = 0
  prefix = string.format("bench-%d-%d", os.time(), id)
end

function request()
  counter = counter + 1
  local body = string.format(
    '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s-%d"},"spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}}',
    prefix, counter)
  return wrk.format("POST", "/api/v1/namespaces/default/pods",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}, body)
end

-- The first refusals are printed (status and Status message), so a run's non-2xx count says why.
local shown = 0
function response(status, headers, body)
  if status >= 300 and shown < 3 then
    shown = shown + 1
    io.stderr:write(string.format("refused %d: %s\n", status, string.sub(body, 1, 300)))
  end
end
