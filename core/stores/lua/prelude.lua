-- Shared by every rule's Lua: constants as in core/rules.py, and helpers.
-- 1 / 0 is math.huge: a function library runs its top level where no `math` is defined yet.
local EPSILON, INFINITY, MAX_IDLE_SECONDS = 1e-9, 1 / 0, 86400
local RULES = {}

-- Doubles go back to Python as text with every digit, so nothing is lost on the way.
local function number(x)
  return string.format('%.17g', x)
end

-- A key's time to live: until its state is idle, plus a second of slack, never less than a
-- second. Relative, so that it holds whatever clock the caller injected.
local function ttl_ms(seconds)
  local ms = math.ceil(seconds * 1000) + 1000
  if ms < 1000 then return 1000 end
  return ms
end
