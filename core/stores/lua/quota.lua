-- quota: the Lua twin of Quota in core/quotas.py; same arithmetic, same doubles.
-- State: "start used", the start of the period counted in (epoch seconds; 0 for credits) and
-- the cost used in it. Its args: limit, soft (1 or 0), credits (1 or 0), then, per call, the
-- start and end of the current period, which the store computes where zoneinfo is (a script
-- has none) on the caller's wall clock; `now` is this server's TIME, or the injected clock.
local quota = {}
-- Seconds a period's count outlives the period: see PERIOD_SLACK in core/quotas.py.
local PERIOD_SLACK = 60

function quota.load(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local start, used = string.match(raw, '^(%S+) (%S+)$')
  return {tonumber(start), tonumber(used)}
end

-- The period counted in and its cost so far: the state's, unless it is of an earlier period
-- (then this one, from nothing). A later period's (a caller whose clock is ahead) counts.
local function counted(state, start)
  if state and state[1] >= start then return state[1], state[2] end
  return start, 0
end

function quota.wait(state, now, cost, floor, limit, soft, credits, start, finish)
  if soft == 1 then return 0 end
  local _, used = counted(state, start)
  if used + cost + floor - limit <= EPSILON then return 0 end
  if credits == 1 or cost + floor > limit then return INFINITY end
  return finish - now
end

-- Returns true, new state, room left; or false, the wait. A soft quota always takes.
function quota.attempt(state, now, cost, floor, limit, soft, credits, start, finish)
  local period, used = counted(state, start)
  used = used + cost
  if soft ~= 1 and used + floor - limit > EPSILON then
    local wait = quota.wait(state, now, cost, floor, limit, soft, credits, start, finish)
    if wait == 0 then wait = EPSILON end
    return false, wait
  end
  return true, {period, used}, limit - used
end

function quota.balance(state, now, limit, soft, credits, start, finish)
  local _, used = counted(state, start)
  return limit - used
end

function quota.remaining(state, now, limit, soft, credits, start, finish)
  return math.max(0, quota.balance(state, now, limit, soft, credits, start, finish))
end

function quota.save(key, state, now, cost, lease, limit, soft, credits, start, finish)
  local value = number(state[1]) .. ' ' .. number(state[2])
  if credits == 1 then
    redis.call('SET', key, value)  -- a balance never goes idle: no TTL
  else
    redis.call('SET', key, value, 'PX', ttl_ms(finish - now + PERIOD_SLACK))
  end
end

-- A settled reservation's difference, or a top-up (a refund of credits taken now): a charge
-- goes into the current period, past the limit if need be; a refund comes off it only if the
-- estimate was taken in it. Credits take both.
function quota.adjust(key, now, delta, taken_at, limit, soft, credits, start, finish)
  local period, used = counted(quota.load(key), start)
  if delta > 0 or credits == 1 then
    used = used + delta
  elseif taken_at >= period then
    used = math.max(0, used + delta)
  end
  if used == 0 then
    redis.call('DEL', key)
  else
    quota.save(key, {period, used}, now, delta, nil, limit, soft, credits, start, finish)
  end
end

RULES['quota'] = quota
