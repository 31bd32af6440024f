-- leaky_bucket: the Lua twin of LeakyBucket in tests/core/test_twins.py, a plug-in rule
-- that brings its own twin. State: "level at", the bucket's level at the time `at`.
local leaky = {}

function leaky.load(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local level, at = string.match(raw, '^(%S+) (%S+)$')
  return {tonumber(level), tonumber(at)}
end

local function level_of(state, now, rate)
  if not state then return 0 end
  local level = state[1] - (now - state[2]) * rate
  if level > 0 then return level end
  return 0
end

function leaky.attempt(state, now, cost, floor, capacity, rate)
  local level = level_of(state, now, rate) + cost
  local over = level + floor - capacity
  if over > EPSILON then
    if cost + floor > capacity then return false, INFINITY end
    return false, over / rate
  end
  return true, {level, now}, capacity - level
end

function leaky.remaining(state, now, capacity, rate)
  return math.max(0, capacity - level_of(state, now, rate))
end

function leaky.save(key, state, now, cost, lease, capacity, rate)
  redis.call('SET', key, number(state[1]) .. ' ' .. number(state[2]), 'PX', ttl_ms(state[1] / rate))
end

RULES['leaky_bucket'] = leaky
