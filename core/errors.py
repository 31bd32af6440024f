"""The engine's error types: one per kind of failure, all under LimiterError."""


class LimiterError(Exception):
    """Base class of every error the engine raises on purpose."""


class ConfigError(LimiterError, ValueError):
    """A config that cannot build a limiter. `path` names where it went wrong."""

    def __init__(self, message: str, path: str = "") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)


class InvalidRequest(LimiterError, ValueError):
    """A decision request the limiter cannot answer: a bad cost, an unknown priority."""

    def __init__(self, message: str, field: str = "") -> None:
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}" if field else message)


class StoreUnavailable(LimiterError):
    """The store could not be reached; the limiter applies each level's fail mode. `sent`:
    whether the call may have reached the store all the same (it failed on the way, or its
    answer came too late); False when the circuit breaker refused it without a try."""

    def __init__(self, message: str = "", sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class ReservationNotFound(LimiterError, LookupError):
    """No open or settled reservation has this id: it never existed, or its hold ran out."""


class ReservationSettled(LimiterError):
    """The reservation was already committed or cancelled; settling it again changes nothing."""
