
local DAY = 86400000000
local CONCURRENCY_RETRY = 1000000
local cost = tonumber(ARGV[6])
local spend = tonumber(ARGV[12])

local function gcra(key, limit, n)
  if limit <= 0 then return {ok = true} end
  local interval = PERIOD / limit
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now)
  local after = tat + n * interval
  local b = {ok = after - now <= PERIOD + EPS, base = tat, tat = after, limit = limit}
  if not b.ok then b.wait = (n > limit) and -1 or (after - PERIOD - now) end
  return b
end

-- remaining and reset (µs) of a bucket, after this request if admitted, else as it stands
local function view(b, admitted)
  if b.limit == nil then return 0, 0 end
  local shown = admitted and b.tat or b.base
  local interval = PERIOD / b.limit
  local left = math.floor((PERIOD - (shown - now) + EPS) / interval)
  return math.max(0, math.min(b.limit, left)), math.ceil(shown - now)
end

-- Howard Hinnant's civil_from_days / days_from_civil, for UTC months.
local function civil(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
local function first_day(y, m)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m > 2) and (m - 3) or (m + 9)
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100)
    + math.floor((153 * mp + 2) / 5)
  return era * 146097 + doe - 719468
end

local function budget(used, n, limit, ends)
  if limit <= 0 or used + n <= limit then return nil end
  if n > limit then return -1 end
  return ends - now
end

local req = gcra(KEYS[1], tonumber(ARGV[1]), 1)
local tok = gcra(KEYS[2], tonumber(ARGV[2]), cost)
-- Leases past their TTL free their slot but stay a grace period, to be settled.
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[9]))
local max_conc = tonumber(ARGV[3])
local day = math.floor(now / DAY)
local y, m = civil(day)
local month = y * 12 + m - 1
local month_end = (m == 12) and first_day(y + 1, 1) or first_day(y, m + 1)
local b = redis.call('HMGET', KEYS[4], 'd', 'du', 'm', 'mu', 'dc', 'mc')
local day_used = (tonumber(b[1]) == day) and tonumber(b[2]) or 0
local month_used = (tonumber(b[3]) == month) and tonumber(b[4]) or 0
local day_cost = (tonumber(b[1]) == day) and tonumber(b[5] or '0') or 0
local month_cost = (tonumber(b[3]) == month) and tonumber(b[6] or '0') or 0

local waits = {
  req.wait, tok.wait,
  (max_conc > 0 and redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf') >= max_conc)
    and CONCURRENCY_RETRY or nil,
  budget(day_used, cost, tonumber(ARGV[4]), (day + 1) * DAY),
  budget(month_used, cost, tonumber(ARGV[5]), month_end * DAY),
  budget(day_cost, spend, tonumber(ARGV[10]), (day + 1) * DAY),
  budget(month_cost, spend, tonumber(ARGV[11]), month_end * DAY),
}
local reason, wait = 0, 0
for i = 1, 7 do
  local w = waits[i]
  if w ~= nil and wait ~= -1 and (w == -1 or w > wait or reason == 0) then
    reason, wait = i, w
  end
end
if reason == 0 then
  if tonumber(ARGV[1]) > 0 then save_tat(KEYS[1], req.tat) end
  if tonumber(ARGV[2]) > 0 and cost > 0 then save_tat(KEYS[2], tok.tat) end
  local ttl = tonumber(ARGV[8])
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[7])
  redis.call('PEXPIRE', KEYS[3], math.ceil((ttl + tonumber(ARGV[9])) / 1000))
  if tonumber(ARGV[4]) > 0 or tonumber(ARGV[5]) > 0 or tonumber(ARGV[10]) > 0
      or tonumber(ARGV[11]) > 0 then
    day_cost, month_cost = day_cost + spend, month_cost + spend
    redis.call('HSET', KEYS[4], 'd', day, 'du', day_used + cost, 'dc', day_cost,
      'm', month, 'mu', month_used + cost, 'mc', month_cost)
    redis.call('PEXPIREAT', KEYS[4], (month_end + 1) * 86400000)
  end
end
local req_left, req_reset = view(req, reason == 0)
local tok_left, tok_reset = view(tok, reason == 0)
return {reason, math.ceil(wait), req_left, req_reset, tok_left, tok_reset, day, month,
  day_cost, month_cost}
