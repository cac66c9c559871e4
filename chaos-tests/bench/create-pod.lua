-- wrk script: each request creates a new Pod with a unique name.
local token = os.getenv("TOKEN")
local counter = 0
local prefix = string.format("bench-%d", os.time())

request = function()
  counter = counter + 1
  local body = string.format(
    '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s-%d-%d"},"spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}}',
    prefix, math.random(1, 1000000000), counter)
  return wrk.format("POST", "/api/v1/namespaces/default/pods",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}, body)
end
