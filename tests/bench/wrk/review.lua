-- POST AdmissionReview bodies over keep-alive connections and check every answer.
--
--   wrk -t1 -c4 -d5s -s review.lua https://127.0.0.1:8443 -- UID /mutate=body.json [/validate=other.json ...]
--
-- Several path=file pairs are sent in turn on each connection. An answer counts as good when its status is 200
-- and its body echoes UID. done() prints one line "BENCH_JSON {...}" with the figures (latencies in microseconds).

local uid = ""
local requests = {}
local next_index = 1
good, bad, last_bad = 0, 0, ""
local threads = {}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  uid = args[1]
  local headers = {["Content-Type"] = "application/json", ["Accept"] = "application/json"}
  for i = 2, #args do
    local path, file = args[i]:match("^([^=]+)=(.+)$")
    table.insert(requests, wrk.format("POST", path, headers, read(file)))
  end
end

function request()
  local r = requests[next_index]
  next_index = next_index % #requests + 1
  return r
end

function response(status, headers, body)
  if status == 200 and body:find(uid, 1, true) then
    good = good + 1
  else
    bad = bad + 1
    last_bad = tostring(status) .. " " .. body:sub(1, 200)
  end
end

local function quote(s)
  return '"' .. s:gsub('\\', '\\\\'):gsub('"', '\\"'):gsub('[%c]', ' ') .. '"'
end

function done(summary, latency, requests_stats)
  local total_good, total_bad, sample = 0, 0, ""
  for _, t in ipairs(threads) do
    total_good = total_good + t:get("good")
    total_bad = total_bad + t:get("bad")
    local s = t:get("last_bad")
    if s ~= "" then sample = s end
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"good":%d,"bad":%d,"bad_sample":%s,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes, total_good, total_bad, quote(sample),
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max))
end
