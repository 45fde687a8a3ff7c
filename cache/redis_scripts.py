"""Lua scripts of the Redis cache store: each change of shared state is one atomic script.

Layout (every key under the hash tag `{prefix}`, so a Redis Cluster keeps a deployment on
one slot; KEYS[1] is always the stream, which routes the script to that slot):

    {p}:cache:entry:<id>   hash: meta vector features response (cache/codec.py), and
                           ns exact norm exp hits last_hit; PEXPIREAT exp + 1 h, a
                           backstop for when no replica sweeps
    {p}:cache:keys:<ns>    hash: exact or normalized key -> entry id
    {p}:cache:lru:<ns>     zset: entry id -> last use (insert or hit), for LRU eviction
    {p}:cache:expiry       zset: entry id -> expiry (unix s), for the sweeper and resync
    {p}:cache:seq          counter: one per stream message, so a tailer can see a gap
    {p}:cache:stream       stream: put (ns id vec exp), del (ns ids as JSON: evicted or
                           deleted), flush (ns)
"""

from __future__ import annotations

_PRELUDE = """
local P = ARGV[1]
local STREAM, SEQ, EXPIRY = KEYS[1], P .. ':cache:seq', P .. ':cache:expiry'
local function k_entry(id) return P .. ':cache:entry:' .. id end
local function k_keys(ns) return P .. ':cache:keys:' .. ns end
local function k_lru(ns) return P .. ':cache:lru:' .. ns end

local function publish(maxlen, ...)
  local seq = redis.call('INCR', SEQ)
  redis.call('XADD', STREAM, 'MAXLEN', '~', maxlen, '*', 'seq', seq, ...)
end

local function drop(ns, id)
  local e = k_entry(id)
  for _, key in ipairs(redis.call('HMGET', e, 'exact', 'norm')) do
    if key and redis.call('HGET', k_keys(ns), key) == id then
      redis.call('HDEL', k_keys(ns), key)
    end
  end
  redis.call('DEL', e)
  redis.call('ZREM', k_lru(ns), id)
  redis.call('ZREM', EXPIRY, id)
end

local function forget_if_empty(ns)
  if redis.call('ZCARD', k_lru(ns)) == 0 then redis.call('DEL', k_keys(ns)) end
end
"""

# ARGV: P ns id meta vector features response exact norm now exp pexpireat max maxlen
# Returns the ids evicted to make room.
PUT = (
    _PRELUDE
    + """
local ns, id, maxlen = ARGV[2], ARGV[3], ARGV[14]
local e = k_entry(id)
local old_ns = redis.call('HGET', e, 'ns')
if old_ns then
  drop(old_ns, id)
  publish(maxlen, 'op', 'del', 'ns', old_ns, 'ids', cjson.encode({id}))
end
redis.call('HSET', e, 'meta', ARGV[4], 'vector', ARGV[5], 'features', ARGV[6],
  'response', ARGV[7], 'ns', ns, 'exact', ARGV[8], 'norm', ARGV[9], 'exp', ARGV[11],
  'hits', 0, 'last_hit', 0)
redis.call('PEXPIREAT', e, ARGV[12])
redis.call('HSET', k_keys(ns), ARGV[8], id, ARGV[9], id)
redis.call('ZADD', k_lru(ns), ARGV[10], id)
redis.call('ZADD', EXPIRY, ARGV[11], id)
publish(maxlen, 'op', 'put', 'ns', ns, 'id', id, 'vec', ARGV[5], 'exp', ARGV[11])
local over = redis.call('ZCARD', k_lru(ns)) - tonumber(ARGV[13])
if over <= 0 then return {} end
local victims = redis.call('ZRANGE', k_lru(ns), 0, over - 1)
for _, victim in ipairs(victims) do drop(ns, victim) end
publish(maxlen, 'op', 'del', 'ns', ns, 'ids', cjson.encode(victims))
return victims
"""
)

# ARGV: P ns key. Returns the entry hash as a flat list, or nil.
GET = (
    _PRELUDE
    + """
local id = redis.call('HGET', k_keys(ARGV[2]), ARGV[3])
if not id then return false end
local fields = redis.call('HGETALL', k_entry(id))
if #fields == 0 then
  redis.call('HDEL', k_keys(ARGV[2]), ARGV[3])
  return false
end
return fields
"""
)

# ARGV: P id now. Returns 1 if the entry exists.
HIT = (
    _PRELUDE
    + """
local e = k_entry(ARGV[2])
local ns = redis.call('HGET', e, 'ns')
if not ns then return 0 end
redis.call('HINCRBY', e, 'hits', 1)
redis.call('HSET', e, 'last_hit', ARGV[3])
redis.call('ZADD', k_lru(ns), 'XX', ARGV[3], ARGV[2])
return 1
"""
)

# ARGV: P now limit. Returns {ids looked at, entries removed}. No stream message: every
# replica drops expired entries from its own index on its own clock.
EXPIRE = (
    _PRELUDE
    + """
local ids = redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local removed = 0
for _, id in ipairs(ids) do
  local ns = redis.call('HGET', k_entry(id), 'ns')
  if ns then
    drop(ns, id)
    forget_if_empty(ns)
    removed = removed + 1
  end
  redis.call('ZREM', EXPIRY, id)
end
return {#ids, removed}
"""
)

# ARGV: P ns maxlen. Returns how many entries were removed.
FLUSH = (
    _PRELUDE
    + """
local ns = ARGV[2]
local ids = redis.call('ZRANGE', k_lru(ns), 0, -1)
for _, id in ipairs(ids) do
  redis.call('DEL', k_entry(id))
  redis.call('ZREM', EXPIRY, id)
end
redis.call('DEL', k_keys(ns), k_lru(ns))
publish(ARGV[3], 'op', 'flush', 'ns', ns)
return #ids
"""
)

# ARGV: P id maxlen. Returns the entry's namespace, or nil if there is no such entry.
DELETE = (
    _PRELUDE
    + """
local id = ARGV[2]
local ns = redis.call('HGET', k_entry(id), 'ns')
if not ns then return false end
drop(ns, id)
forget_if_empty(ns)
publish(ARGV[3], 'op', 'del', 'ns', ns, 'ids', cjson.encode({id}))
return ns
"""
)
