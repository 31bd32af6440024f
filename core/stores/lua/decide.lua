-- One decision, atomically: phase 1 asks every rule whether the cost fits, phase 2 takes
-- from all of them or from none. The same two phases as core/twophase.py.
-- KEYS: one state key per check; in 'reserve' and 'settle' mode, then the reservation's record.
-- ARGV[1]: "now cost lease mode" then, per check, "rule floor counts-requests enforcement args",
--   all space-separated, args the rule's own numbers joined by commas (its twin's `args`,
--   then any numbers of the call's time, its `per_call`: core/twins.py). enforcement is '0'
--   (enforced), '1' (shadow) or '2' (soft: never denies, named when it goes over). now is '-'
--   for this server's TIME, lease '-' for none, mode 'decide', 'release', 'reserve', 'settle'
--   (where cost is the actual cost, '-' to cancel) or 'adjust' (cost the difference to charge,
--   below zero to give back: a top-up). One argument rather than several per check: every
--   argument costs the client more to encode than the server spends parsing it here.
-- 'reserve' also takes ARGV[2], when the reservation expires, and ARGV[3...], its record's
--   fields and values, written when the decision takes.
-- Returns, for 'decide' and 'reserve': the room left, as a bare string, when every rule
--   took, no shadow rule would deny and no soft rule went over (the common answer, the
--   cheapest to send and read); else {blocker (-1 when allowed), wait, remaining, {shadow
--   checks that would deny}, {soft checks taken past their limit}}.
--   'release' returns {slots released}; 'settle' returns {'ok', slots released, delta},
--   {'missing'} or {'settled', status}; 'adjust' returns every check's balance after.
--
-- A rule's Lua registers a table as RULES['<its file's stem>'], with, `...` standing for its
-- args:
--   load(key) -> state (nil when none)
--   attempt(state, now, cost, floor, ...) -> true, new state, room left; or false, wait
--   remaining(state, now, ...) -> room now
--   save(key, new state, now, cost, lease, ...): write what attempt returned
-- and, if it has them: adjust(key, now, delta, taken_at, ...) (a settled reservation's
-- difference), release(key, now, lease) -> slots freed, shorten_lease(key, lease, by),
-- balance(state, now, ...) -> what is left, below zero in debt (default: remaining).

-- The checks of a spec, parsed once: loaded as a function library (FUNCTION LOAD), these
-- locals live from one call to the next, so a plan seen before costs one table look-up.
-- The cache forgets everything at MAX_PLANS specs (plans differ by rules and floors, not by
-- keys, so a deployment has a few dozen). Run as a plain script, it starts empty every time.
local plans, plan_count, MAX_PLANS = {}, 0, 1000

local function parse_checks(spec)
  local checks = {}
  for kind, floor, per_request, enforcement, numbers in string.gmatch(spec, ' (%S+) (%S+) (%S+) (%S+) (%S+)') do
    local args = {}
    for number in string.gmatch(numbers, '[^,]+') do args[#args + 1] = tonumber(number) end
    checks[#checks + 1] = {rule = RULES[kind], floor = tonumber(floor), per_request = per_request == '1',
                           shadow = enforcement == '1', soft = enforcement == '2', args = args}
  end
  return checks
end

local function checks_of(spec)
  local checks = plans[spec]
  if not checks then
    if plan_count >= MAX_PLANS then plans, plan_count = {}, 0 end
    checks = parse_checks(spec)
    plans[spec], plan_count = checks, plan_count + 1
  end
  return checks
end

-- Free the slots that lease `held` holds in every check's rule that has any.
local function release_all(checks, keys, now, held)
  local released = 0
  for i, check in ipairs(checks) do
    if check.rule.release then released = released + check.rule.release(keys[i], now, held) end
  end
  return released
end

local function decide(KEYS, ARGV)
  local now, cost_text, lease, mode, spec = string.match(ARGV[1], '^(%S+) (%S+) (%S+) (%S+)(.*)$')
  if now == '-' then
    local t = redis.call('TIME')
    now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  else
    now = tonumber(now)
  end
  local cost = tonumber(cost_text)
  local checks = checks_of(spec)

  if mode == 'release' then
    return {release_all(checks, KEYS, now, lease)}
  end

  if mode == 'adjust' then
    -- Outside any reservation (a top-up): every rule adjusted by the difference, now.
    local balances = {}
    for i, check in ipairs(checks) do
      local rule = check.rule
      if rule.adjust then rule.adjust(KEYS[i], now, cost, now, unpack(check.args)) end
      balances[i] = number((rule.balance or rule.remaining)(rule.load(KEYS[i]), now, unpack(check.args)))
    end
    return balances
  end

  if mode == 'settle' then
    -- Check the record is open, mark it settled (it stays, as a tombstone, until its TTL runs
    -- out), adjust every rule that counts cost by the difference, and free the lease's slots.
    local record = KEYS[#checks + 1]
    local raw = redis.call('HGETALL', record)
    local fields = {}
    for i = 1, #raw, 2 do fields[raw[i]] = raw[i + 1] end
    if not fields.status or now >= tonumber(fields.expires_at) then return {'missing'} end
    if fields.status ~= 'open' then return {'settled', fields.status} end
    if cost then
      redis.call('HSET', record, 'status', 'committed', 'actual_cost', cost_text)
    else
      redis.call('HSET', record, 'status', 'cancelled', 'actual_cost', 'null')
    end
    local delta = (cost or 0) - tonumber(fields.cost)
    local taken_at = tonumber(fields.taken_at)
    if delta ~= 0 then
      for i, check in ipairs(checks) do
        -- A shadow rule that would have denied took nothing: it has nothing to settle.
        if not check.per_request and check.rule.adjust and not fields['untaken:' .. KEYS[i]] then
          check.rule.adjust(KEYS[i], now, delta, taken_at, unpack(check.args))
        end
      end
    end
    local released = 0
    if fields.lease ~= '' then released = release_all(checks, KEYS, now, fields.lease) end
    return {'ok', released, number(delta)}
  end

  local worst, blocker, shadows, states, taken, left, amounts = 0, -1, {}, {}, {}, {}, {}
  for i, check in ipairs(checks) do
    local state = check.rule.load(KEYS[i])
    states[i] = state
    local amount = cost
    if check.per_request then amount = 1 end
    local fits, new_state, room = check.rule.attempt(state, now, amount, check.floor, unpack(check.args))
    if fits then
      taken[i], left[i], amounts[i] = new_state, room, amount
    elseif check.shadow then
      shadows[#shadows + 1] = i - 1
    elseif new_state > worst then
      worst, blocker = new_state, i - 1
    end
  end

  if blocker >= 0 then
    local check = checks[blocker + 1]
    local room = check.rule.remaining(states[blocker + 1], now, unpack(check.args))
    return {blocker, number(worst), number(room), shadows}
  end

  local remaining, over = INFINITY, {}
  for i, check in ipairs(checks) do
    if amounts[i] then  -- a shadow rule that would deny takes nothing, as if it were enforced
      check.rule.save(KEYS[i], taken[i], now, amounts[i], lease, unpack(check.args))
      if check.soft then
        -- Never in the way, so not in `remaining`; named when this took it past its limit.
        if left[i] < -EPSILON then over[#over + 1] = i - 1 end
      elseif not check.shadow and left[i] < remaining then
        remaining = left[i]
      end
    end
  end

  if mode == 'reserve' then
    -- The record, with a TTL until it expires; and the slots taken last no longer than it.
    local record, expires_at = KEYS[#checks + 1], tonumber(ARGV[2])
    for i, check in ipairs(checks) do
      if amounts[i] and lease ~= '-' and check.rule.shorten_lease then
        check.rule.shorten_lease(KEYS[i], lease, expires_at)
      end
    end
    redis.call('HSET', record, unpack(ARGV, 3))
    for _, i in ipairs(shadows) do redis.call('HSET', record, 'untaken:' .. KEYS[i + 1], '1') end
    redis.call('PEXPIRE', record, ttl_ms(expires_at - now))
  end
  if #shadows == 0 and #over == 0 then return number(remaining) end
  return {-1, '0', number(remaining), shadows, over}
end
