"""Alerts, evaluated off the decisions' path and delivered to signed webhooks.

    start_alerts()                     # a serving process (limiter_admin/wsgi.py): a round every few seconds
    AlertRounds(every=None).run({"acme"}, now)   # one round by hand (tests, the benchmark)
    send_test(alert)                   # POST /api/v1/alerts/{name}/test and the console's button

A round, in the process's one flushing thread (core.flusher), every LIMITER_ALERT_EVERY s:

1. The tenants seen since the last round: the statistics tell each flush's (DenialStats'
   on_flush, policies.telemetry), so a round looks at tenants with traffic, never at all.
2. For each, the enabled alerts: `denied_share` reads its denied share over the alert's
   window from the statistics (every worker's counts, in whole minutes; the round's tenants'
   minutes in one round trip per 500); `quota_used` reads its quotas as they stand
   (services.quotas). A share past the threshold is a crossing.
3. A crossing fires once: a firing row, unique on (alert, tenant, level, rule, threshold,
   period_start). Every worker that sees it tries the insert; one commits, the others' fail
   and they remember it is done. A denied share's period is its window (aligned to the
   epoch), and it fires at most once within a window of its last firing as well.
4. Due deliveries (new firings, and retries whose backoff has passed) are claimed, each by
   one worker (a conditional update), and handed to the bounded pool `DELIVERIES`, which
   posts them; the round never waits for a receiver. Each attempt is logged; a failure is
   tried again after LIMITER_ALERT_BACKOFF x 2^(attempt-1) s, LIMITER_ALERT_ATTEMPTS in all.
5. /metrics' quota bands are set from the database's count of tenants at 80, 90 and 100 %.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NamedTuple

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Count, F, Q

from core import StoreUnavailable
from core.flusher import DROP, FLUSHER, Flushable, Flusher

from ..alerts import MAX_ERROR, MAX_RULE_NAME, Alert, AlertDelivery, AlertFiring, QuotaBand, moment
from ..metrics import ALERT_DELIVERIES, ALERT_FIRINGS, ALERT_ROUND_SECONDS, QUOTA_BANDS, QUOTA_TENANTS
from ..telemetry import denial_stats, on_tenants_flushed
from .errors import Busy
from .jobs import JobPool
from .quotas import tenant_quotas
from .webhooks import Attempt, Fired, alert_body, post

log = logging.getLogger(__name__)

TIMEOUT = settings.LIMITER_ALERT_TIMEOUT
ATTEMPTS = settings.LIMITER_ALERT_ATTEMPTS
BACKOFF = settings.LIMITER_ALERT_BACKOFF
# A claimed delivery's hold: another worker takes it over only after this long (its worker
# died mid-attempt). Longer than any attempt, whose timeout counts per connect and per read.
CLAIM = 60.0 + 4 * TIMEOUT
# This worker's deliveries: two receivers waited on at once, and a queue; never a thread each.
DELIVERIES = JobPool("alerts", workers=2, waiting=100, retry_after=TIMEOUT)
MAX_SEEN = 100_000  # tenants remembered between two rounds (core.stats.MAX_TENANTS a minute)
MAX_REMEMBERED = 100_000  # firings this worker knows are done, and bands it wrote
KEEP_LOG = 30 * 86400.0  # deliveries, and firings whose period ended, are kept this long
PRUNE_EVERY = 3600.0
RECHECK_CREDITS = 60.0  # seconds a worker trusts that a balance of credits' alert fired


class Crossing(NamedTuple):
    """A tenant's share past an alert's threshold, in a period: what fires, once."""

    alert: Alert
    tenant: str
    level: str
    rule: str
    period_start: int
    resets_at: int | None
    value: float

    @property
    def key(self) -> tuple:
        return (self.alert.pk, self.alert.threshold, self.tenant, self.level, self.rule, self.period_start)


# --- evaluating ---------------------------------------------------------------------------------


def denied_shares(tenants: list[str], window: int) -> dict[str, float | None]:
    """Each tenant's denied decisions over the last `window` seconds (whole minutes, every
    worker's), as a share of its decisions; None without decisions. One read for them all."""
    stats = denial_stats()
    counts = stats.denials(tenants, min(window, stats.usage_minutes))
    return {tenant: denied / decisions if decisions else None for tenant, (decisions, denied) in counts.items()}


def quota_share(quota: dict[str, Any]) -> float | None:
    """How much of its limit a quota used (1.0: all of it); None for a quota without a limit."""
    limit, used = quota.get("limit"), quota.get("used")
    if not isinstance(limit, (int, float)) or not isinstance(used, (int, float)) or limit <= 0:
        return None
    return used / limit


def crossings(
    alerts: Iterable[Alert],
    tenant: str,
    now: float,
    quotas: list[dict[str, Any]],
    shares: dict[int, dict[str, float | None]],
) -> Iterator[Crossing]:
    """The alerts whose threshold the tenant's shares pass now: its denied share over an
    alert's window (`shares`: window -> tenant -> share) above it, a quota's use at or above it."""
    for alert in alerts:
        if alert.kind == "denied_share":
            window = alert.window_seconds or 60
            share = shares.get(window, {}).get(tenant)
            if share is not None and share > alert.threshold:
                start = int(now // window * window)
                yield Crossing(alert, tenant, "", "", start, start + window, share)
            continue
        for quota in quotas:
            share = quota_share(quota)
            if share is not None and share >= alert.threshold:
                period, resets = int(quota.get("period_start") or 0), quota.get("resets_at")
                until = None if resets is None else int(resets)
                yield Crossing(alert, tenant, quota["level"], str(quota["rule"])[:MAX_RULE_NAME], period, until, share)


FIRED, TAKEN, TOO_SOON = "fired", "taken", "too soon"


def fire(crossing: Crossing, now: float) -> tuple[str, AlertFiring | None]:
    """Record the firing of `crossing`, due for delivery now: (FIRED, the firing); (TAKEN,
    None) when it fired already, here or in another worker; (TOO_SOON, None) for a denied
    share that fired within a window before now."""
    alert = crossing.alert
    if alert.kind == "denied_share":
        window = alert.window_seconds or 60
        if AlertFiring.objects.filter(alert=alert, tenant=crossing.tenant, at__gt=moment(now - window)).exists():
            return TOO_SOON, None
    # A quota without a period (credits) has none to name: its firing's row keeps 0.
    period_start = None if alert.kind == "quota_used" and not crossing.period_start else crossing.period_start
    fired = Fired(
        alert.name,
        alert.kind,
        crossing.tenant,
        crossing.level or None,
        crossing.rule or None,
        alert.threshold,
        crossing.value,
        period_start,
        crossing.resets_at,
        alert.window,
    )
    try:
        with transaction.atomic():
            firing = AlertFiring.objects.create(
                alert=alert,
                tenant=crossing.tenant,
                level=crossing.level,
                rule=crossing.rule,
                threshold=alert.threshold,
                period_start=crossing.period_start,
                resets_at=crossing.resets_at,
                value=crossing.value,
                at=moment(now),
                body=alert_body(fired, now, alert.format).decode(),
                next_attempt=now,
            )
    except IntegrityError:
        return TAKEN, None  # another worker's insert won: it delivers
    ALERT_FIRINGS.labels(alert.kind).inc()
    return FIRED, firing


def fresh_connections() -> None:
    """As Django does around a request: close this thread's database connections that are
    broken or past their age; never one inside a transaction (a caller's, a test's)."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


# --- delivering ---------------------------------------------------------------------------------


def backoff(attempt: int) -> float:
    """Seconds before the attempt after failed attempt number `attempt` (1, 2, ...)."""
    return BACKOFF * 2 ** (attempt - 1)


def claim_due(now: float, most: int) -> list[int]:
    """Take up to `most` deliveries that are due (new, or a retry whose backoff passed, or
    one whose worker died mid-attempt) for this worker: each is taken by one worker alone."""
    due = (
        AlertFiring.objects.filter(state="pending", next_attempt__lte=now, alert__enabled=True)
        .order_by("next_attempt")
        .values_list("pk", "next_attempt")[: max(most, 0)]
    )
    claimed = []
    for pk, was in due:
        taken = AlertFiring.objects.filter(pk=pk, state="pending", next_attempt=was).update(next_attempt=now + CLAIM)
        if taken:
            claimed.append(pk)
    return claimed


def dispatch(now: float, clock: Callable[[], float], pool: JobPool = DELIVERIES) -> list[Future]:
    """Hand the due deliveries to `pool`, as many as it has room for; their futures."""
    room = pool.workers + pool.waiting - pool.held
    sent = []
    for pk in claim_due(now, room):
        try:
            sent.append(pool.submit(deliver, pk, clock))
        except Busy:  # its room was taken meanwhile (a test send): due again at the next round
            AlertFiring.objects.filter(pk=pk).update(next_attempt=now)
    return sent


def deliver(pk: int, clock: Callable[[], float] = time.time) -> Attempt | None:
    """One attempt of firing `pk`'s delivery (in a pool's thread): post it to its alert's
    URL, log the attempt, and mark the firing delivered, failed, or due again later."""
    try:
        firing = AlertFiring.objects.select_related("alert").filter(pk=pk, state="pending").first()
        if firing is None:
            return None
        alert, number = firing.alert, firing.attempts + 1
        attempt = post(alert.url, firing.body.encode(), alert.secret, TIMEOUT, f"{firing.pk}")
        now = clock()
        log_attempt(alert, firing, number, attempt, now)
        update: dict[str, Any] = {"attempts": number}
        if attempt.ok:
            update["state"], result = "delivered", "delivered"
        elif number >= ATTEMPTS:
            update["state"], result = "failed", "given_up"
        else:
            update["next_attempt"], result = now + backoff(number), "failed"
        AlertFiring.objects.filter(pk=pk).update(**update)
        ALERT_DELIVERIES.labels(result).inc()
        return attempt
    except Exception:
        log.exception("alerts: delivering firing %s failed (a bug); it is tried again after its claim", pk)
        return None
    finally:
        # Deliveries are rare: the pool's idle threads hold no database connection meanwhile.
        connections.close_all()


def log_attempt(alert: Alert, firing: AlertFiring | None, number: int, attempt: Attempt, now: float) -> AlertDelivery:
    """The delivery log's row of one attempt (a test's has no firing)."""
    return AlertDelivery.objects.create(
        alert=alert,
        firing=firing,
        attempt=number,
        at=moment(now - attempt.duration),
        status=attempt.status,
        ok=attempt.ok,
        error=attempt.error[:MAX_ERROR],
        duration=round(attempt.duration, 6),
    )


def send_test(alert: Alert, clock: Callable[[], float] = time.time, pool: JobPool = DELIVERIES) -> AlertDelivery:
    """Send a test delivery of `alert` now, on the deliveries' pool, and log it: its row says
    how it went. Busy when the pool is full."""
    now = clock()
    fired = Fired(alert.name, alert.kind, None, None, None, alert.threshold, None, None, None, alert.window, True)
    body = alert_body(fired, now, alert.format)
    future = pool.submit(post, alert.url, body, alert.secret, TIMEOUT, "test")
    try:
        attempt = future.result(timeout=3 * TIMEOUT + 1)
    except FutureTimeout:
        attempt = Attempt(None, False, f"no answer within {3 * TIMEOUT + 1:g} s", 3 * TIMEOUT + 1)
    ALERT_DELIVERIES.labels("test").inc()
    return log_attempt(alert, None, 1, attempt, clock())


# --- quota bands (for /metrics) -----------------------------------------------------------------


def band_of(quotas: list[dict[str, Any]]) -> tuple[int, int | None]:
    """The highest band (80, 90, 100; 0 below them) the quotas reached, and until when: the
    latest end among the quotas that reached it (None: credits, which do not reset)."""
    band, until, forever = 0, 0, False
    for quota in quotas:
        share = quota_share(quota)
        reached = max((b for b in QUOTA_BANDS if share is not None and share >= b / 100), default=0)
        resets = quota.get("resets_at")
        if reached > band:
            band, until, forever = reached, 0, False
        if reached == band and reached:
            forever = forever or resets is None
            until = max(until, int(resets or 0))
    return band, None if forever or not band else until


def count_bands(now: float) -> dict[int, int]:
    """Tenants at or above each band, in their quotas' current periods."""
    live = QuotaBand.objects.filter(Q(until__isnull=True) | Q(until__gt=now), band__gt=0)
    counts = dict(live.values_list("band").annotate(n=Count("id")).values_list("band", "n"))
    return {band: sum(n for b, n in counts.items() if b >= band) for band in QUOTA_BANDS}


def tenants_near_quota(now: float, most: int) -> tuple[list[tuple[str, int]], int]:
    """The tenants at or above the lowest band in their quotas' current periods, highest band
    first (then by key), at most `most` of them; and how many there are in all."""
    live = QuotaBand.objects.filter(Q(until__isnull=True) | Q(until__gt=now), band__gt=0)
    rows = list(live.order_by("-band", "tenant").values_list("tenant", "band")[:most])
    return rows, live.count()


# --- rounds ---------------------------------------------------------------------------------------


class Remembered:
    """A bounded map of what this worker knows already (oldest forgotten first)."""

    def __init__(self, most: int = MAX_REMEMBERED) -> None:
        self.most = most
        self._items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        return self._items.get(key)

    def put(self, key: Any, value: Any = True) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.most:
            self._items.popitem(last=False)

    def forget(self, key: Any) -> None:
        self._items.pop(key, None)


class Seen(frozenset):
    """A round's batch: the tenants seen since the last round (empty rounds still run)."""


class AlertRounds(Flushable):
    """The evaluation rounds of this process, on the flusher's schedule (every `every`
    seconds; None: only when run by hand). A store or database that fails drops the round's
    tenants (they come back with their next traffic) and leaves the deliveries as they are."""

    on_store_error = DROP
    what = "alert evaluation"

    def __init__(
        self,
        every: float | None,
        clock: Callable[[], float] = time.time,
        pool: JobPool = DELIVERIES,
        flusher: Flusher | None = None,
    ) -> None:
        self.clock, self.pool = clock, pool
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.fired = Remembered()  # crossings this worker knows fired (here or elsewhere)
        self.bands = Remembered()  # tenant -> the band this worker last wrote
        self.armed = Remembered()  # credits' crossings this worker saw under their threshold
        self._pruned_at = -PRUNE_EVERY
        self.dispatched: list[Future] = []  # the last round's deliveries, for a test to wait on
        self.tenants_dropped = 0  # past MAX_SEEN between two rounds
        super().__init__(every, flusher)

    def tenants_flushed(self, tenants: frozenset[str]) -> None:
        """The statistics' on_flush: remember the tenants for the next round."""
        with self._lock:
            room = MAX_SEEN - len(self._seen)
            if len(tenants) > room:
                self.tenants_dropped += len(tenants) - room
                tenants = frozenset(list(tenants - self._seen)[:room]) if room > 0 else frozenset()
            self._seen |= tenants

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._seen = set()
        super().after_fork()

    def take(self) -> Seen:
        with self._lock:
            seen, self._seen = self._seen, set()
        return Seen(seen)

    def write(self, batch: Seen) -> int:
        try:
            return self.run(batch, self.clock())
        except DatabaseError as error:  # the flusher's word for a store that fails
            raise StoreUnavailable(f"the database: {error}") from error

    def run(self, tenants: Iterable[str], now: float) -> int:
        """One round at `now`: evaluate `tenants`, fire, dispatch what is due, set the bands;
        how many tenants it evaluated."""
        started = time.perf_counter()  # the round's cost, measured
        fresh_connections()
        try:
            alerts = list(Alert.objects.filter(enabled=True))
            seen = sorted(tenants)
            windows = {alert.window_seconds or 60 for alert in alerts if alert.kind == "denied_share"}
            shares = {window: denied_shares(seen, window) for window in windows} if seen else {}
            for tenant in seen:
                self.evaluate(tenant, alerts, now, shares)
            self.dispatched = dispatch(now, self.clock, self.pool)
            for band, count in count_bands(now).items():
                QUOTA_TENANTS.labels(str(band)).set(count)
            if now - self._pruned_at >= PRUNE_EVERY:
                prune(now)
                self._pruned_at = now
        finally:
            fresh_connections()
        ALERT_ROUND_SECONDS.observe(time.perf_counter() - started)
        return len(seen)

    def evaluate(
        self, tenant: str, alerts: list[Alert], now: float, shares: dict[int, dict[str, float | None]]
    ) -> list[AlertFiring]:
        """One tenant: its quota band, and the alerts it fires now (its denied shares read
        for the round's tenants at once: `shares`, window -> tenant -> share)."""
        quotas = tenant_quotas(tenant)
        self.note_band(tenant, quotas)
        self.rearm_credits(tenant, alerts, quotas)
        fired = []
        for crossing in crossings(alerts, tenant, now, quotas, shares):
            known = self.fired.get(crossing.key)
            # A period's firing is for good; a balance of credits' is asked again now and then,
            # as a top-up seen by another worker may have re-armed it.
            if known is not None and (crossing.period_start or now - known < RECHECK_CREDITS):
                continue
            outcome, firing = fire(crossing, now)
            if outcome != TOO_SOON:  # too soon is asked again, until its window has passed
                self.fired.put(crossing.key, now)
            if firing is not None:
                self.armed.forget(crossing.key)
                fired.append(firing)
        return fired

    def rearm_credits(self, tenant: str, alerts: list[Alert], quotas: list[dict[str, Any]]) -> None:
        """A balance of credits (a quota with no period) has no next period to fire in: its
        alert fires again once a top-up has taken it back under the threshold. Its firing
        then gives up its place (period_start: minus its id, so that the row and its log stay),
        once per time it is seen under the threshold."""
        for alert in alerts:
            if alert.kind != "quota_used":
                continue
            for quota in quotas:
                share = quota_share(quota)
                if quota.get("period_start") is not None or share is None or share >= alert.threshold:
                    continue
                rule = str(quota["rule"])[:MAX_RULE_NAME]
                key = (alert.pk, alert.threshold, tenant, quota["level"], rule, 0)
                if self.armed.get(key):
                    continue
                same = {"tenant": tenant, "level": quota["level"], "rule": rule, "threshold": alert.threshold}
                fired = AlertFiring.objects.filter(alert=alert, period_start=0, **same).exclude(state="pending")
                fired.update(period_start=-F("id"))
                self.armed.put(key)
                self.fired.forget(key)

    def note_band(self, tenant: str, quotas: list[dict[str, Any]]) -> None:
        """Write the tenant's band when it changed since this worker last wrote it."""
        band, known = band_of(quotas), self.bands.get(tenant)
        if band == known or (known is None and not quotas):  # a tenant without quotas: nothing to write
            return
        if band[0] == 0:
            QuotaBand.objects.filter(tenant=tenant).delete()
        else:
            QuotaBand.objects.update_or_create(tenant=tenant, defaults={"band": band[0], "until": band[1]})
        self.bands.put(tenant, band)


def prune(now: float) -> None:
    """Forget deliveries older than KEEP_LOG, and settled firings whose period ended that long ago."""
    AlertDelivery.objects.filter(at__lt=moment(now - KEEP_LOG)).delete()
    AlertFiring.objects.filter(resets_at__lt=now - KEEP_LOG).exclude(state="pending").delete()


_rounds: AlertRounds | None = None


def start_alerts(every: float | None = None) -> AlertRounds | None:
    """Evaluate alerts in this process, every `every` seconds (LIMITER_ALERT_EVERY; 0: not in
    this process), for the tenants its statistics flush. Once per process; a serving process
    calls it (limiter_admin/wsgi.py, asgi.py), commands and tests do not."""
    global _rounds
    every = settings.LIMITER_ALERT_EVERY if every is None else every
    if _rounds is None and every > 0:
        _rounds = AlertRounds(every)
        on_tenants_flushed(_rounds.tenants_flushed)
        FLUSHER.start()
    return _rounds
