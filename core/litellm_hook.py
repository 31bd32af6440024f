"""LiteLLM's proxy on Limiter Admin's reservations: a CustomLogger that LiteLLM's config names
under `callbacks` (docs/LLM_GATEWAYS.md has the tested configuration):

    litellm_settings:
      callbacks: core.litellm_hook.limiter

Before a call it reserves the call's estimated tokens on the keys of its team and user, so
that concurrent calls cannot overspend a budget; a denial is LiteLLM's 429 with Retry-After.
After the call it settles with the real usage. A failure, a timeout or a client that went
away (asyncio.CancelledError included) cancels the reservation at once. A settlement that the
API cannot take (unreachable, or a 503 while its store is down) is tried again, with growing
pauses, while the reservation's hold lasts. A proxy that dies leaves the reservation to its
hold: its concurrency slot comes back when the hold runs out, and its estimate stays spent.

Only imported inside a LiteLLM proxy's environment (litellm and fastapi come with
`litellm[proxy]`); the rest of core never imports it. The settings come from the environment:

    LIMITER_URL, LIMITER_TOKEN   the REST API and a decide-scope token
    LIMITER_FAIL                 closed (the default: a 503 while the API cannot be reached)
                                 or open (the call goes, unlimited)
    LIMITER_DEFAULT_OUTPUT       the output tokens a call without max_tokens is reserved for
                                 (default 1024; fewer when the tenant has fewer left)
    LIMITER_HOLD                 seconds a reservation is held at most (default: the API's)
    LIMITER_TIMEOUT              seconds each request to the API may take (default 2)
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException  # type: ignore[import-not-found]
from litellm.integrations.custom_logger import CustomLogger  # type: ignore[import-not-found]

from .async_client import AsyncLimiterClient, AsyncRemoteReservation
from .decision import Decision
from .errors import LimiterError
from .remote import LimiterAPIError, LimiterUnavailable, RateLimited

log = logging.getLogger("core.litellm_hook")

DEFAULT_OUTPUT = 1024
DEFAULT_TIMEOUT = 2.0  # seconds each request to the API may take
# Open reservations kept before those whose hold ran out are looked for and dropped.
FORGET_AFTER = 10_000
# The request fields that cap a call's output, the larger of them counting (PR #34223: a call
# giving both must not pass with the smaller).
OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# A settlement the API could not take is tried again after FIRST_PAUSE seconds, the pause
# doubling up to LONGEST_PAUSE, while the reservation's hold lasts.
FIRST_PAUSE, LONGEST_PAUSE = 0.1, 2.0
# Where a request names its team and priority without LiteLLM's database.
TEAM_HEADER, PRIORITY_HEADER = "x-limiter-team", "x-limiter-priority"


class LimiterHook(CustomLogger):
    """Reserve before a call, settle after it. `client` is made from LIMITER_URL and
    LIMITER_TOKEN on first use (on the proxy's own event loop) unless given."""

    def __init__(
        self,
        client: AsyncLimiterClient | None = None,
        fail: str | None = None,
        default_output: int | None = None,
        hold: float | None = None,
    ) -> None:
        super().__init__()
        self._client = client
        self.fail = (fail or os.environ.get("LIMITER_FAIL") or "closed").lower()
        if self.fail not in ("open", "closed"):
            raise ValueError(f"LIMITER_FAIL must be open or closed, not {self.fail!r}")
        self.default_output = default_output or int(os.environ.get("LIMITER_DEFAULT_OUTPUT") or DEFAULT_OUTPUT)
        held = hold if hold is not None else os.environ.get("LIMITER_HOLD")
        self.hold = float(held) if held else None
        self.open: dict[str, AsyncRemoteReservation] = {}  # by LiteLLM's call id

    @property
    def client(self) -> AsyncLimiterClient:
        if self._client is None:
            timeout = float(os.environ.get("LIMITER_TIMEOUT") or DEFAULT_TIMEOUT)
            self._client = AsyncLimiterClient(os.environ["LIMITER_URL"], os.environ["LIMITER_TOKEN"], timeout=timeout)
        return self._client

    # Before the call ---------------------------------------------------------------------------

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        call_id = data.get("litellm_call_id")
        keys = self.keys(user_api_key_dict, data)
        priority = _metadata(data).get("priority") or _header(data, PRIORITY_HEADER)
        prompt = prompt_tokens(data)
        cap = output_cap(data)
        try:
            estimate = prompt + cap if cap is not None else await self._uncapped(keys, prompt, priority)
            reservation = await self.client.reserve(keys, cost=estimate, priority=priority, hold=self.hold)
        except RateLimited as denied:
            decision = denied.decision
            raise HTTPException(status_code=429, detail=_denial(decision), headers=_headers(decision)) from None
        except LimiterUnavailable as error:
            if self.fail == "open":
                log.warning("the limiter cannot be reached (%s): the call goes unlimited (LIMITER_FAIL=open)", error)
                return data
            raise HTTPException(
                status_code=503,
                detail={"error": "limiter_unavailable", "message": f"the rate limiter cannot be reached: {error}"},
                headers={"Retry-After": "1"},
            ) from None
        if reservation.id is not None and isinstance(call_id, str):
            if len(self.open) >= FORGET_AFTER:
                self.forget_expired()
            self.open[call_id] = reservation
        return data

    def forget_expired(self) -> None:
        """Drop the reservations whose hold has run out: a call that LiteLLM ended through no
        hook of ours (the server gave their cost back already) must not stay in memory."""
        now = datetime.now(UTC)
        for call_id, reservation in list(self.open.items()):
            if reservation.expires_at is not None and reservation.expires_at <= now:
                del self.open[call_id]

    def keys(self, user_api_key_dict: Any, data: Mapping[str, Any]) -> dict[str, str]:
        """The virtual key's team and user when LiteLLM's database gives them, else the
        `x-limiter-team` header and the request's `user`; and the global key."""
        if _has_database():
            team, user = getattr(user_api_key_dict, "team_id", None), getattr(user_api_key_dict, "user_id", None)
        else:
            team, user = _header(data, TEAM_HEADER), data.get("user")
        keys = {"global": "*"}
        if team:
            keys["team"] = str(team)
        if user:
            keys["user"] = str(user)
        return keys

    async def _uncapped(self, keys: Mapping[str, str], prompt: int, priority: str | None) -> int:
        """A call with no output cap: the prompt and the default output, or what the keys have
        left when that is less (PR #28805: a small key's first call is not refused)."""
        estimate = prompt + self.default_output
        decision = await self.client.decide(keys, cost=estimate, priority=priority, dry_run=True)
        if decision.allowed or math.isinf(decision.remaining):
            return estimate
        return max(prompt + 1, min(estimate, int(decision.remaining)))

    # After the call ----------------------------------------------------------------------------

    async def async_post_call_success_hook(self, data: dict, user_api_key_dict: Any, response: Any) -> Any:
        await self._settle(data.get("litellm_call_id"), used_tokens(response))
        return response

    async def async_log_success_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        # Streams end here (and calls that the success hook did not see).
        logged = kwargs.get("standard_logging_object") or {}
        used = used_tokens(response_obj) or _positive(logged.get("total_tokens"))
        await self._settle(kwargs.get("litellm_call_id"), used)

    async def async_post_call_failure_hook(
        self, request_data: dict, original_exception: Exception, user_api_key_dict: Any, traceback_str: Any = None
    ) -> None:
        await self._cancel(request_data.get("litellm_call_id"))

    async def async_log_failure_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        await self._cancel(kwargs.get("litellm_call_id"))

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict
    ) -> AsyncGenerator[Any, None]:
        """Pass the stream through; a stream that is not read to its end (the client went
        away: GeneratorExit or CancelledError) cancels the reservation at once."""
        finished = False
        try:
            async for chunk in response:
                yield chunk
            finished = True
        finally:
            if not finished:
                await asyncio.shield(self._cancel(request_data.get("litellm_call_id")))

    async def _settle(self, call_id: Any, used: int | None) -> None:
        """Commit the call's reservation in a task of its own, off the answer's path: the
        answer does not wait for it, and the client's `aclose` does."""
        reservation = self.open.pop(call_id, None) if isinstance(call_id, str) else None
        if reservation is None:
            return
        if used is None:
            log.warning("call %s: no usage to read; settled at its estimate of %s", call_id, reservation.cost)
        what = f"call {call_id}: settling {reservation.id}"
        self.client.shielded(settled(reservation, lambda: reservation.commit(used), what))

    async def _cancel(self, call_id: Any) -> None:
        """Cancel the call's reservation: the first try awaited (the call's answer goes once its
        cost is back), any later one in the background."""
        reservation = self.open.pop(call_id, None) if isinstance(call_id, str) else None
        if reservation is None:
            return
        what = f"call {call_id}: cancelling {reservation.id}"
        task = self.client.shielded(settled(reservation, reservation.cancel, what))
        await asyncio.wait({task}, timeout=self.client.timeout)


async def settled(reservation: AsyncRemoteReservation, settle: Callable[[], Awaitable[Any]], what: str) -> None:
    """`settle()` until the API has it: while it cannot be reached, or answers 503 (its store
    is down), it is tried again after a pause (FIRST_PAUSE, doubled each time up to
    LONGEST_PAUSE) as long as the reservation's hold lasts. A settlement lost would leave the
    call charged its estimate, not its usage. A 409 after a retry is an earlier try that
    reached the API after all; any other refusal is logged and ends it."""
    pause, retried = FIRST_PAUSE, False
    while True:
        try:
            await settle()
            return
        except LimiterUnavailable as error:
            failure: LimiterError = error
        except LimiterAPIError as error:
            if retried and error.status == 409:
                return
            if error.status is None or error.status < 500:
                log.warning("%s failed: %s", what, error)
                return
            failure = error
        except LimiterError as error:
            log.warning("%s failed: %s", what, error)
            return
        expires_at = reservation.expires_at
        left = (expires_at - datetime.now(UTC)).total_seconds() if expires_at is not None else 0.0
        if left <= pause:
            log.warning("%s failed, and its hold runs out before another try: %s", what, failure)
            return
        log.warning("%s failed (%s); trying again in %.1f s", what, failure, pause)
        await asyncio.sleep(pause)
        pause, retried = min(pause * 2, LONGEST_PAUSE), True


# --- counting tokens -------------------------------------------------------------------------------


def prompt_tokens(data: Mapping[str, Any]) -> int:
    """The prompt's tokens by LiteLLM's own counter: chat messages, a completion's prompt, an
    embedding's or a response's input."""
    from litellm import token_counter  # type: ignore[import-not-found]

    model = str(data.get("model") or "")
    try:
        if data.get("messages"):
            return int(token_counter(model=model, messages=data["messages"]))
        for field in ("prompt", "input"):
            value = data.get(field)
            if isinstance(value, str):
                return int(token_counter(model=model, text=value))
            if isinstance(value, list) and value:
                if all(isinstance(item, str) for item in value):
                    return sum(int(token_counter(model=model, text=item)) for item in value)
                if all(isinstance(item, dict) for item in value):
                    return int(token_counter(model=model, messages=value))
                return len(value)  # token ids
    except Exception as error:  # a counter that cannot read it: count characters instead
        log.warning("counting the prompt's tokens failed (%s): estimating from its length", error)
        return max(1, len(str(data.get("messages") or data.get("prompt") or data.get("input") or "")) // 4)
    return 1


def output_cap(data: Mapping[str, Any]) -> int | None:
    """The largest output cap the request gives, or None when it gives none."""
    caps = [int(value) for name in OUTPUT_CAPS if isinstance(value := data.get(name), (int, float)) and value > 0]
    return max(caps) if caps else None


def used_tokens(response: Any) -> int | None:
    """A response's total tokens: chat, completions and embeddings (`usage.total_tokens`),
    /v1/responses (`input_tokens` + `output_tokens` when no total); None when unreadable."""
    usage = _field(response, "usage")
    if usage is None:
        return None
    total = _positive(_field(usage, "total_tokens"))
    if total is not None:
        return total
    parts = [_positive(_field(usage, name)) for name in ("input_tokens", "output_tokens", "prompt_tokens")]
    known = [part for part in parts if part is not None]
    return sum(known) if known else None


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


# --- the request's data -----------------------------------------------------------------------------


def _has_database() -> bool:
    """Whether the proxy has LiteLLM's database, and so virtual keys with teams and users."""
    from litellm.proxy import proxy_server  # type: ignore[import-not-found]

    return getattr(proxy_server, "prisma_client", None) is not None


def _metadata(data: dict) -> dict:
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        metadata = data["metadata"] = {}
    return metadata


def _header(data: Mapping[str, Any], name: str) -> str | None:
    request = data.get("proxy_server_request") or {}
    headers = request.get("headers") if isinstance(request, Mapping) else None
    if not isinstance(headers, Mapping):
        return None
    for key, value in headers.items():
        if str(key).lower() == name:
            return str(value)
    return None


def _denial(decision: Decision) -> dict[str, Any]:
    wait = None if math.isinf(decision.retry_after) else decision.retry_after
    return {
        "error": "rate_limited",
        "message": f"rate limited by {decision.blocked_by} ({decision.reason})",
        "blocked_by": decision.blocked_by,
        "retry_after": wait,
    }


def _headers(decision: Decision) -> dict[str, str]:
    """Retry-After (whole seconds, up) and the RateLimit field (draft-ietf-httpapi-ratelimit-
    headers) of the rule that denied; no Retry-After when the call can never fit."""
    headers: dict[str, str] = {}
    name = (decision.blocked_by or "limit").split("(")[0].replace(" ", "").replace('"', "")
    remaining = 0 if math.isinf(decision.remaining) else max(0, int(decision.remaining))
    if math.isinf(decision.retry_after):
        headers["RateLimit"] = f'"{name}";r={remaining}'
    else:
        wait = max(1, math.ceil(decision.retry_after))
        headers["Retry-After"] = str(wait)
        headers["RateLimit"] = f'"{name}";r={remaining};t={wait}'
    return headers


limiter = LimiterHook()
