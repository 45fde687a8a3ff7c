
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local PERIOD = 60000000
local EPS = 1
local function save_tat(key, tat)
  if tat > now then
    redis.call('SET', key, string.format('%.17g', tat), 'PX', math.ceil((tat - now) / 1000))
  else
    redis.call('DEL', key)
  end
end
