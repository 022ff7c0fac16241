"""The one error tree of ovpool.

Every error that crosses a process boundary carries a stable wire ``code``; the client re-raises a
remote error as the same class (``from_wire``). Foreign exceptions (OSError, zmq, OpenVINO, gguf)
are translated once, where they enter ovpool, with ``raise ... from exc``. ``permanent(exc)`` tells
an error that every start would repeat (a worker stops on one with exit status EXIT_PERMANENT).

::

    OvpoolError                      code
    ├── ConfigError                  config
    │   ├── UnknownSettingError      config.unknown_setting
    │   └── InvalidSettingError      config.invalid_setting
    ├── ModelError                   model
    │   ├── ModelFormatError         model.format        bad or inconsistent GGUF (names the field)
    │   ├── UnsupportedModelError    model.unsupported   architecture or weight type not handled
    │   └── ModelLoadError           model.load          OpenVINO failed to build or compile it
    ├── InferenceError               inference           a loaded model failed while generating
    ├── CacheError                   cache
    │   ├── CacheMissError           cache.miss          cache-only mode found no usable entry
    │   ├── CacheCorruptError        cache.corrupt       blob or manifest failed its checks
    │   ├── CacheLockedError         cache.locked        another process held a lock past cache_lock_timeout_s
    │   └── CacheUnsupportedError    cache.unsupported   a configuration the cache refuses
    ├── ProtocolError                protocol
    │   ├── MalformedMessageError    protocol.malformed
    │   ├── UnsupportedVersionError  protocol.version
    │   └── AuthenticationError      protocol.auth
    └── RequestError                 request
        ├── InvalidRequestError      request.invalid     bad parameters, prompt too long, ...
        ├── UnauthorizedError        request.unauthorized  missing or unknown HTTP API key
        ├── ModelNotFoundError       request.model_not_found
        ├── QueueFullError           request.queue_full
        ├── RequestTimeoutError      request.timeout
        ├── CancelledError           request.cancelled
        ├── WorkerLostError          request.worker_lost
        ├── ClientTooSlowError       request.client_too_slow  a stream unread for stream_stall_s
        ├── StreamGapError           request.stream_gap  a PARTIAL of a stream went missing
        ├── BrokerUnavailableError   request.broker_unavailable
        │   ├── BrokerLostError      request.broker_unavailable.lost  died, or stopped answering
        │   └── NotActiveError       request.broker_unavailable.not_active  a standby broker: try its peer
        └── DrainingError            request.draining    the pool (or worker) is draining: retry
"""

from __future__ import annotations

# The exit status of a process stopped by an error that a restart cannot change (``permanent``):
# ``ovpool serve`` reports such a worker failing at once instead of retrying it like a crash.
EXIT_PERMANENT = 3


class OvpoolError(Exception):
    """Base of every ovpool error. ``str(err)`` is the message a user reads."""

    code = "ovpool"

    def __init__(self, message: str = ""):
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        # Pickle by message alone so subclasses with richer __init__ still cross processes.
        return (_rebuild, (self.code, self.message))

    def to_wire(self) -> tuple[str, str]:
        return self.code, self.message


class ConfigError(OvpoolError):
    code = "config"


class UnknownSettingError(ConfigError):
    code = "config.unknown_setting"


class InvalidSettingError(ConfigError):
    code = "config.invalid_setting"


class ModelError(OvpoolError):
    code = "model"


class ModelFormatError(ModelError):
    code = "model.format"


class UnsupportedModelError(ModelError):
    code = "model.unsupported"


class ModelLoadError(ModelError):
    code = "model.load"


class InferenceError(OvpoolError):
    """The model loaded, but a forward pass (or anything else of a running generation) failed."""

    code = "inference"


class CacheError(OvpoolError):
    code = "cache"


class CacheMissError(CacheError):
    code = "cache.miss"


class CacheCorruptError(CacheError):
    code = "cache.corrupt"


class CacheLockedError(CacheError):
    code = "cache.locked"


class CacheUnsupportedError(CacheError):
    code = "cache.unsupported"


class ProtocolError(OvpoolError):
    code = "protocol"


class MalformedMessageError(ProtocolError):
    code = "protocol.malformed"


class UnsupportedVersionError(ProtocolError):
    code = "protocol.version"


class AuthenticationError(ProtocolError):
    code = "protocol.auth"


class RequestError(OvpoolError):
    code = "request"


class InvalidRequestError(RequestError):
    """``param`` names the request field at fault, where one is (the HTTP API reports it)."""

    code = "request.invalid"

    def __init__(self, message: str = "", param: str | None = None):
        super().__init__(message)
        self.param = param


class UnauthorizedError(RequestError):
    code = "request.unauthorized"


class ModelNotFoundError(RequestError):
    code = "request.model_not_found"


class QueueFullError(RequestError):
    code = "request.queue_full"


class RequestTimeoutError(RequestError):
    code = "request.timeout"


class CancelledError(RequestError):
    code = "request.cancelled"


class WorkerLostError(RequestError):
    code = "request.worker_lost"


class ClientTooSlowError(RequestError):
    code = "request.client_too_slow"


class StreamGapError(RequestError):
    code = "request.stream_gap"


class BrokerUnavailableError(RequestError):
    code = "request.broker_unavailable"


class BrokerLostError(BrokerUnavailableError):
    """The broker this client had a connection to is gone: the connection dropped and did not come
    back within connect_timeout_s (its process exited or was killed), or it stays connected but
    answers no PING (stopped, e.g. SIGSTOP, or hung). What was outstanding may have run or not:
    restart the broker and resend (a standby pair's client fails over instead, ovpool.failover)."""

    code = "request.broker_unavailable.lost"


class NotActiveError(BrokerUnavailableError):
    """The broker asked is the passive one of a standby pair (docs/operations.md, Standby broker):
    its peer serves. Retryable there: a client, worker or HTTP API that knows both endpoints fails
    over to the other and sends what is unfinished again."""

    code = "request.broker_unavailable.not_active"


class DrainingError(RequestError):
    """The pool is draining (a shutdown or restart): a new request is refused at once, and one
    still running when the drain's shutdown_timeout_s ends fails with this. Retryable: send it
    again in a moment, or to another replica (HTTP: 503 with Retry-After)."""

    code = "request.draining"


def permanent(exc: BaseException) -> bool:
    """Whether ``exc`` fails the same way on every start: a bad setting, a model file that is
    missing, malformed or unsupported, a cache-only miss. Not a compile that OpenVINO failed
    (ModelLoadError: memory, a device), a cache lock held elsewhere, or anything at run time."""
    return isinstance(exc, (ConfigError, ModelFormatError, UnsupportedModelError, ModelNotFoundError,
                            CacheMissError, CacheUnsupportedError))


def _all_subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


BY_CODE: dict[str, type[OvpoolError]] = {
    cls.code: cls for cls in [OvpoolError, *_all_subclasses(OvpoolError)]
}


def from_wire(code: str, message: str) -> OvpoolError:
    """The error a remote peer sent, as its own class; an unknown code falls back to its parent.

    A newer peer may send ``request.something_new``; the nearest known ancestor by dotted prefix
    keeps ``except RequestError`` working on an older client.
    """
    probe = code
    while probe not in BY_CODE and "." in probe:
        probe = probe.rsplit(".", 1)[0]
    cls = BY_CODE.get(probe, OvpoolError)
    return cls(message)


def _rebuild(code: str, message: str) -> OvpoolError:
    return from_wire(code, message)
