-- wrk script for the end-to-end test: four users, one request in ten to /export, and per status a count;
-- a 429 lacking the rate-limit headers (tb-rls's RateLimit and RateLimit-Policy, Envoy's X-RateLimit-Limit)
-- is counted as bare. done() prints one "status N COUNT" line per status and "bare429 N".
local users = { "u1", "u2", "u3", "u4" }
local threads = {}
local counter = 0

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  statuses = {}
  bare429 = 0
end

function request()
  counter = counter + 1
  local path = "/"
  if counter % 10 == 0 then
    path = "/export"
  end
  return wrk.format("GET", path, { ["x-user"] = users[(counter % 4) + 1] })
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 429 then
    local seen = {}
    for name, _ in pairs(headers) do
      seen[string.lower(name)] = true
    end
    if not (seen["ratelimit"] and seen["ratelimit-policy"] and seen["x-ratelimit-limit"]) then
      bare429 = bare429 + 1
    end
  end
end

function done(summary, latency, requests)
  local totals = {}
  local bare = 0
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      totals[status] = (totals[status] or 0) + count
    end
    bare = bare + thread:get("bare429")
  end
  for status, count in pairs(totals) do
    io.write(string.format("status %d %d\n", status, count))
  end
  io.write(string.format("bare429 %d\n", bare))
end
