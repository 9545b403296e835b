-- POST AdmissionReview bodies over keep-alive connections and check every answer.
--
--   wrk -t1 -c4 -d5s -s review.lua https://127.0.0.1:8443 -- ECHOED /mutate=body.json [/validate=other.json ...]
--
-- Several path=file pairs are sent in turn on each connection. An answer counts as good when its status is 200
-- and its body holds ECHOED (the start of a renumbered uid: the bodies' request uids carry the token below). done() prints one line "BENCH_JSON {...}" with the figures (latencies in microseconds).
-- A body that holds the token SEQ-0000000000 gets a number of its own (seq-TTNNNNNNNN: thread and count, the same
-- width, lower case as names are) in every place of it on every request, so that no two requests carry the same
-- object: the same pod with another name and uid (a replica), or with another annotation too (a new object).

local uid = ""
local requests = {}
local next_index = 1
good, bad, last_bad = 0, 0, ""
local threads = {}
local TOKEN = "SEQ-0000000000"
local headers = {["Content-Type"] = "application/json", ["Accept"] = "application/json"}
local count = 0

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_id", #threads)
end

function init(args)
  uid = args[1]
  for i = 2, #args do
    local path, file = args[i]:match("^([^=]+)=(.+)$")
    local body = read(file)
    local parts, from = {}, 1
    while true do
      local first, last = body:find(TOKEN, from, true)
      if not first then break end
      table.insert(parts, body:sub(from, first - 1))
      from = last + 1
    end
    if #parts > 0 then
      table.insert(parts, body:sub(from))
      table.insert(requests, {path = path, parts = parts})
    else
      table.insert(requests, {fixed = wrk.format("POST", path, headers, body)})
    end
  end
end

function request()
  local r = requests[next_index]
  next_index = next_index % #requests + 1
  if r.fixed then
    return r.fixed
  end
  count = count + 1
  local seq = string.format("seq-%02d%08d", (thread_id or 0) % 100, count % 100000000)
  return wrk.format("POST", r.path, headers, table.concat(r.parts, seq))
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
