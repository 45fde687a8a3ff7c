
if redis.call('ZREM', KEYS[3], ARGV[3]) == 0 then return 0 end
local delta = tonumber(ARGV[2])
local spent = tonumber(ARGV[6])
if delta == 0 and spent == 0 then return 1 end
local tpm = tonumber(ARGV[1])
if tpm > 0 then
  local interval = PERIOD / tpm
  local tat = tonumber(redis.call('GET', KEYS[2]) or '0')
  if delta < 0 then
    save_tat(KEYS[2], math.max(now, tat + delta * interval))
  else
    save_tat(KEYS[2], math.max(tat, now) + delta * interval)
  end
end
local b = redis.call('HMGET', KEYS[4], 'd', 'm')
if tonumber(b[1]) == tonumber(ARGV[4]) then
  redis.call('HINCRBY', KEYS[4], 'du', delta)
  redis.call('HINCRBY', KEYS[4], 'dc', spent)
end
if tonumber(b[2]) == tonumber(ARGV[5]) then
  redis.call('HINCRBY', KEYS[4], 'mu', delta)
  redis.call('HINCRBY', KEYS[4], 'mc', spent)
end
return 1
