-- fixed_window: the Lua twin of FixedWindow in core/windows.py.
-- State: "index used", the window's number and the cost it has taken.
local fixed = {}

function fixed.load(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local index, used = string.match(raw, '^(%S+) (%S+)$')
  return {tonumber(index), tonumber(used)}
end

local function used_of(state, now, window)
  local index = math.floor(now / window)
  if not state or state[1] ~= index then return index, 0 end
  return index, state[2]
end

function fixed.wait(state, now, cost, floor, limit, window)
  local index, used = used_of(state, now, window)
  if used + cost + floor - limit <= EPSILON then return 0 end
  if cost + floor > limit then return INFINITY end
  return (index + 1) * window - now
end

function fixed.attempt(state, now, cost, floor, limit, window)
  local index, used = used_of(state, now, window)
  used = used + cost
  if used + floor - limit > EPSILON then
    local wait = fixed.wait(state, now, cost, floor, limit, window)
    if wait == 0 then wait = EPSILON end
    return false, wait
  end
  return true, {index, used}, limit - used
end

function fixed.remaining(state, now, limit, window)
  local _, used = used_of(state, now, window)
  return math.max(0, limit - used)
end

function fixed.save(key, state, now, cost, lease, limit, window)
  local value = number(state[1]) .. ' ' .. number(state[2])
  redis.call('SET', key, value, 'PX', ttl_ms((state[1] + 1) * window - now))
end

-- A settled reservation: a refund comes off the window the estimate was taken in, if that
-- is still the current one; a charge goes into the current window, over the limit if need be.
function fixed.adjust(key, now, delta, taken_at, limit, window)
  local index, used = used_of(fixed.load(key), now, window)
  if delta > 0 then
    used = used + delta
  elseif math.floor(taken_at / window) == index then
    used = math.max(0, used + delta)
  end
  if used == 0 then
    redis.call('DEL', key)
  else
    fixed.save(key, {index, used}, now, delta, nil, limit, window)
  end
end

RULES['fixed_window'] = fixed
