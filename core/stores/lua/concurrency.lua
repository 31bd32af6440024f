-- concurrency: the Lua twin of core/concurrency.py.
-- State: a sorted set of lease ids, scored by the time each lease runs out.
local slots = {}

function slots.load(key)
  local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local expiries = {}
  for i = 2, #raw, 2 do expiries[#expiries + 1] = tonumber(raw[i]) end
  return expiries  -- ascending
end

local function first_live(expiries, now)
  local first = 1
  while expiries[first] and expiries[first] <= now do first = first + 1 end
  return first
end

function slots.wait(expiries, now, cost, floor, limit, lease)
  local first = first_live(expiries, now)
  local surplus = (#expiries - first + 1) + cost + floor - limit
  if surplus <= 0 then return 0 end
  if cost + floor > limit then return INFINITY end
  -- Slots free up in order of expiry: wait for as many as are needed.
  return expiries[first + math.ceil(surplus) - 1] - now
end

function slots.attempt(expiries, now, cost, floor, limit, lease)
  local wait = slots.wait(expiries, now, cost, floor, limit, lease)
  if wait > 0 then return false, wait end
  return true, true, limit - (#expiries - first_live(expiries, now) + 2)
end

function slots.remaining(expiries, now, limit, lease)
  return math.max(0, limit - (#expiries - first_live(expiries, now) + 1))
end

function slots.save(key, _, now, cost, lease, limit, lease_seconds)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', number(now))
  redis.call('ZADD', key, number(now + lease_seconds), lease)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, ttl_ms(tonumber(last[2]) - now))
end

function slots.release(key, now, lease)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', number(now))
  return redis.call('ZREM', key, lease)
end

-- A reservation's slot lasts as long as the reservation: its lease runs out by `by`.
function slots.shorten_lease(key, lease, by)
  local expiry = redis.call('ZSCORE', key, lease)
  if expiry and tonumber(expiry) > by then redis.call('ZADD', key, 'XX', number(by), lease) end
end

RULES['concurrency'] = slots
