-- The coordinator of a shared global budget (core/stores/shares.py): a token bucket whose
-- tokens processes take in shares, decide against locally, and give back what they did not use.
-- KEYS[1]: the pool, "tokens at" (tokens in the pool at the time `at`, in seconds).
-- ARGV: now ('-' for this server's TIME), capacity, rate, want, need, give_back.
--   Refill the pool to `now`, add `give_back` (what a share left unused, or a debt when
--   negative), then grant up to `want` if at least `need` is there, else nothing.
-- Returns {granted, pool left, wait}: wait is how long until `need` is there (-1: never).
local now = ARGV[1]
if now == '-' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(now)
end
local capacity, rate = tonumber(ARGV[2]), tonumber(ARGV[3])
local want, need, give_back = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

local tokens = capacity
local raw = redis.call('GET', KEYS[1])
if raw then
  local held, at = string.match(raw, '^(%S+) (%S+)$')
  tokens = tonumber(held)
  if now > tonumber(at) then tokens = tokens + (now - tonumber(at)) * rate end
  if tokens > capacity then tokens = capacity end
end
tokens = math.min(capacity, tokens + give_back)

local granted, wait = 0, 0
if tokens + 1e-9 >= need then
  granted = math.min(want, tokens)
  tokens = tokens - granted
elseif rate > 0 and need <= capacity then
  wait = (need - tokens) / rate
else
  wait = -1
end

-- Kept until full again, plus a second; a pool that never refills, for a day.
local ttl = 86400
if rate > 0 then ttl = (capacity - tokens) / rate end
redis.call('SET', KEYS[1], string.format('%.17g %.17g', tokens, now), 'PX', math.ceil(ttl * 1000) + 1000)
return {string.format('%.17g', granted), string.format('%.17g', tokens), string.format('%.17g', wait)}
