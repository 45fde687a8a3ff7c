
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local b = redis.call('HMGET', KEYS[4], 'd', 'du', 'm', 'mu', 'dc', 'mc')
return {tostring(now), redis.call('GET', KEYS[1]) or '0', redis.call('GET', KEYS[2]) or '0',
  redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf'), b[1] or '-1', b[2] or '0',
  b[3] or '-1', b[4] or '0', b[5] or '0', b[6] or '0'}
