"""One streamed request: from the client session that sends it to the `RequestResult` it
ends in. The only prober code that streams a completion through the HTTP client, for the
daemon, bench and `probe` alike.

Its modules, in the order a request goes through them:

    send      `stream_request`: one `RequestSpec` sent, one `RequestResult` back; every
              fault an outcome, never an exception
    timeouts  a request's deadlines (`Timeouts`) and the one set of their defaults
    classify  the outcome of a fault that ended an attempt, or of a status other than 200
    wire      the aiohttp client session: the send stamped as it is written, each read as
              its bytes arrive (`request_session`, `client_session` for the daemon)
    exchange  what one exchange may receive: its bounds, every byte counted against them
    body      the response body, pushed from the connection's callbacks into the decoding
    sse       SSE framing, and the line splitting of Ollama's NDJSON
    stream    the decoded stream's counts and stamps (`StreamState`), which build the result
    jsonparse the events' JSON, bounded (`loads`: orjson when installed)

The rest of the prober imports the names below from here, and anything else from its module
(`prober.request.wire.client_session`).
"""

from prober.kinds import Api
from prober.request.send import RequestSpec, stream_request
from prober.request.timeouts import BENCH_CONNECT_SECONDS, DEFAULT_TIMEOUTS, Timeouts

__all__ = [
    "BENCH_CONNECT_SECONDS",
    "DEFAULT_TIMEOUTS",
    "Api",
    "RequestSpec",
    "Timeouts",
    "stream_request",
]
