-- token_bucket: the Lua twin of core/buckets.py (TokenBucket and GCRA); same arithmetic, same doubles.
-- State: one integer, the microsecond at which the bucket is full again; or, for a bucket
-- that never refills (rate 0), the tokens spent so far.
local bucket = {}
-- Three microseconds' refill of slack: see TIME_SLACK in core/buckets.py.
local TIME_SLACK = 3e-6

function bucket.load(key)
  local raw = redis.call('GET', key)
  return raw and tonumber(raw)
end

local function start_of(state, now)
  if state and state * 1e-6 > now then return state * 1e-6 end
  return now
end

function bucket.tokens(state, now, capacity, rate)
  if not state then return capacity end
  if rate == 0 then return capacity - state end
  local ahead = state * 1e-6 - now
  if ahead > 0 then return capacity - ahead * rate end
  return capacity
end

function bucket.wait(state, now, cost, floor, capacity, rate)
  local missing = cost + floor - bucket.tokens(state, now, capacity, rate)
  if missing <= EPSILON + rate * TIME_SLACK then return 0 end
  if cost + floor > capacity or rate == 0 then return INFINITY end
  return missing / rate
end

-- Returns true, new state, room left; or false, the wait.
function bucket.attempt(state, now, cost, floor, capacity, rate)
  if rate == 0 then
    local spent = (state or 0) + cost
    local left = capacity - spent
    if left - floor < -EPSILON then return false, INFINITY end
    return true, spent, left
  end
  local start = start_of(state, now)
  local left = capacity - (start - now) * rate - cost
  if left - floor < -(EPSILON + rate * TIME_SLACK) then
    local wait = bucket.wait(state, now, cost, floor, capacity, rate)
    if wait == 0 then wait = EPSILON end
    return false, wait
  end
  return true, math.floor((start + cost / rate) * 1e6 + 0.5), left
end

function bucket.remaining(state, now, capacity, rate)
  return math.max(0, bucket.tokens(state, now, capacity, rate))
end

function bucket.save(key, state, now, cost, lease, capacity, rate)
  if rate == 0 then
    redis.call('SET', key, number(state), 'PX', ttl_ms(MAX_IDLE_SECONDS))
  else
    redis.call('SET', key, string.format('%d', state), 'PX', ttl_ms(state * 1e-6 - now))
  end
end

-- A settled reservation: charge (delta > 0) or give back (delta < 0) the difference from
-- its estimate. A charge may leave the bucket below zero; a refund never fills it past full.
function bucket.adjust(key, now, delta, taken_at, capacity, rate)
  local state = bucket.load(key)
  if rate == 0 then
    local spent = (state or 0) + delta
    if spent > 0 then
      bucket.save(key, spent, now, delta, nil, capacity, rate)
    else
      redis.call('DEL', key)
    end
    return
  end
  local full_at
  if delta > 0 then
    full_at = start_of(state, now) + delta / rate
  elseif not state or state * 1e-6 + delta / rate <= now then
    redis.call('DEL', key)  -- full again
    return
  else
    full_at = state * 1e-6 + delta / rate
  end
  bucket.save(key, math.floor(full_at * 1e6 + 0.5), now, delta, nil, capacity, rate)
end

RULES['token_bucket'] = bucket
