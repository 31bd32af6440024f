-- sliding_window_counter: the Lua twin of SlidingWindowCounter in core/windows.py.
-- State: "index previous current".
local counter = {}

function counter.load(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local index, previous, current = string.match(raw, '^(%S+) (%S+) (%S+)$')
  return {tonumber(index), tonumber(previous), tonumber(current)}
end

local function counts(state, now, window)
  local index = math.floor(now / window)
  if not state then return index, 0, 0 end
  if state[1] == index then return index, state[2], state[3] end
  if state[1] == index - 1 then return index, state[3], 0 end
  return index, 0, 0
end

local function estimate(index, previous, current, now, window)
  local weight = 1.0 - (now - index * window) / window
  return current + previous * weight
end

function counter.wait(state, now, cost, floor, limit, window)
  local index, previous, current = counts(state, now, window)
  local room = limit - floor
  if estimate(index, previous, current, now, window) + cost <= room + EPSILON then return 0 end
  if cost > room then return INFINITY end
  local start = index * window
  local target = room - cost - current
  if target >= 0 and previous > 0 then
    return start + window * (1.0 - target / previous) - now
  end
  target = room - cost
  local later = 0
  if current > target then later = window * (1.0 - target / current) end
  return start + window + later - now
end

function counter.attempt(state, now, cost, floor, limit, window)
  local index, previous, current = counts(state, now, window)
  local left = limit - estimate(index, previous, current, now, window) - cost
  if left - floor < -EPSILON then
    local wait = counter.wait(state, now, cost, floor, limit, window)
    if wait == 0 then wait = EPSILON end
    return false, wait
  end
  return true, {index, previous, current + cost}, left
end

function counter.remaining(state, now, limit, window)
  local index, previous, current = counts(state, now, window)
  return math.max(0, limit - estimate(index, previous, current, now, window))
end

function counter.save(key, state, now, cost, lease, limit, window)
  local value = number(state[1]) .. ' ' .. number(state[2]) .. ' ' .. number(state[3])
  redis.call('SET', key, value, 'PX', ttl_ms((state[1] + 2) * window - now))
end

-- A settled reservation: a refund comes off the window the estimate counted in (current
-- or previous) while it still counts; a charge goes into the current window.
function counter.adjust(key, now, delta, taken_at, limit, window)
  local state = counter.load(key)
  local index, previous, current = counts(state, now, window)
  if delta > 0 then
    current = current + delta
  elseif not state then
    return
  else
    local taken = math.floor(taken_at / window)
    if taken == index then
      current = math.max(0, current + delta)
    elseif taken == index - 1 then
      previous = math.max(0, previous + delta)
    end
  end
  counter.save(key, {index, previous, current}, now, delta, nil, limit, window)
end

RULES['sliding_window_counter'] = counter
