-- One decision, atomically: phase 1 asks every rule whether the cost fits, phase 2 takes
-- from all of them or from none. The same two phases as MemoryStore._decide.
-- KEYS: one state key per check.
-- ARGV[1]: "now cost lease mode" then, per check, "type floor counts-requests shadow a b",
--   all space-separated. now is '-' for this server's TIME, lease '-' for none, mode
--   'decide' or 'release'. One argument rather than six per check: every argument costs the
--   client more to encode than the server spends parsing it here.
-- Returns {blocker (-1 when allowed), wait, remaining, {shadow checks that would deny}}.
local now, cost, lease, mode, spec = string.match(ARGV[1], '^(%S+) (%S+) (%S+) (%S+)(.*)$')
if now == '-' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(now)
end
cost = tonumber(cost)

local checks = {}
for kind, floor, per_request, shadow, a, b in
    string.gmatch(spec, ' (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)') do
  checks[#checks + 1] = {rule = RULES[kind], floor = tonumber(floor),
                         per_request = per_request == '1', shadow = shadow == '1',
                         a = tonumber(a), b = tonumber(b)}
end

if mode == 'release' then
  local released = 0
  for i, check in ipairs(checks) do
    if check.rule.release then released = released + check.rule.release(KEYS[i], now, lease) end
  end
  return {released}
end

local worst, blocker, shadows, found, states = 0, -1, {}, {}, {}
for i, check in ipairs(checks) do
  local state = check.rule.load(KEYS[i])
  local amount = cost
  if check.per_request then amount = 1 end
  local fits, new_state, left = check.rule.attempt(state, now, amount, check.floor, check.a, check.b)
  states[i] = state
  if fits then
    found[i] = {new_state, left, amount}
  else
    found[i] = false
    if check.shadow then
      shadows[#shadows + 1] = i - 1
    elseif new_state > worst then
      worst, blocker = new_state, i - 1
    end
  end
end

if blocker >= 0 then
  local check = checks[blocker + 1]
  local left = check.rule.remaining(states[blocker + 1], now, check.a, check.b)
  return {blocker, number(worst), number(left), shadows}
end

local remaining = INFINITY
for i, check in ipairs(checks) do
  local taken = found[i]
  if taken then  -- a shadow rule that would deny takes nothing, as if it were enforced
    check.rule.save(KEYS[i], taken[1], now, check.a, check.b, taken[3], lease)
    if not check.shadow and taken[2] < remaining then remaining = taken[2] end
  end
end
return {-1, '0', number(remaining), shadows}
