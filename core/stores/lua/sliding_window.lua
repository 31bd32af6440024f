-- sliding_window: the Lua twin of SlidingWindowLog in core/windows.py.
-- State: a list of "time cost" entries, oldest first.
local log = {}

function log.load(key)
  local raw = redis.call('LRANGE', key, 0, -1)
  if #raw == 0 then return nil end
  local entries = {}
  for i, entry in ipairs(raw) do
    local stamp, spent = string.match(entry, '^(%S+) (%S+)$')
    entries[i] = {tonumber(stamp), tonumber(spent)}
  end
  return entries
end

-- The first entry still in the window, and the cost of all from there, summed oldest first.
local function live(entries, now, window)
  local first, used = 1, 0.0
  if not entries then return first, used end
  local cutoff = now - window
  while entries[first] and entries[first][1] <= cutoff do first = first + 1 end
  for i = first, #entries do used = used + entries[i][2] end
  return first, used
end

function log.wait(entries, now, cost, floor, limit, window)
  local first, used = live(entries, now, window)
  local over = used + cost + floor - limit
  if over <= EPSILON then return 0 end
  if cost + floor > limit then return INFINITY end
  local freed = 0.0
  for i = first, #entries do
    freed = freed + entries[i][2]
    if freed >= over - EPSILON then return entries[i][1] + window - now end
  end
  return INFINITY
end

function log.attempt(entries, now, cost, floor, limit, window)
  local wait = log.wait(entries, now, cost, floor, limit, window)
  if wait > 0 then return false, wait end
  local first, used = live(entries, now, window)
  return true, first, limit - (used + cost)
end

function log.remaining(entries, now, limit, window)
  local _, used = live(entries, now, window)
  return math.max(0, limit - used)
end

function log.save(key, first, now, cost, lease, limit, window)
  if first > 1 then redis.call('LTRIM', key, first - 1, -1) end
  redis.call('RPUSH', key, number(now) .. ' ' .. number(cost))
  redis.call('PEXPIRE', key, ttl_ms(window))
end

-- A settled reservation: a charge logs a new entry at now; a refund comes off the entries
-- logged at taken_at (newest first) while they are in the window. The log is then written
-- again, without what left the window and without entries refunded to nothing.
function log.adjust(key, now, delta, taken_at, limit, window)
  local entries = log.load(key)
  local first = live(entries, now, window)
  if delta > 0 then
    log.save(key, first, now, delta, nil, limit, window)
    return
  end
  if not entries then return end
  local refund = -delta
  for i = #entries, first, -1 do
    if refund <= 0 or entries[i][1] < taken_at then break end
    if entries[i][1] == taken_at then
      local back = math.min(refund, entries[i][2])
      entries[i][2] = entries[i][2] - back
      refund = refund - back
    end
  end
  redis.call('DEL', key)
  local kept, newest = {}, nil
  for i = first, #entries do
    if entries[i][2] > 0 then
      kept[#kept + 1] = number(entries[i][1]) .. ' ' .. number(entries[i][2])
      newest = entries[i][1]
    end
  end
  for i = 1, #kept, 1000 do  -- unpack() has a limit on how many values it hands over
    redis.call('RPUSH', key, unpack(kept, i, math.min(i + 999, #kept)))
  end
  if newest then redis.call('PEXPIRE', key, ttl_ms(newest + window - now)) end
end

RULES['sliding_window'] = log
