"""Whether an error is an outage (a service could not answer now) or a verdict on the input.

Bad input goes to a dead-letter place with the reason; an outage never does, however long it
lasts, since it says nothing about the input. The bookkeeper tells them apart where it counts
failures towards a dead letter (a rewrite request that keeps failing, `rewrites.py`).
"""

from __future__ import annotations

from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ServerError,
    ServiceUnavailableError,
    TooManyRequestsError,
)
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from thrift.transport.TTransport import TTransportException

from icekeeper.bookkeeper.datafiles import FileUnavailable

OUTAGES: tuple[type[BaseException], ...] = (
    OSError,  # storage and network: connection refused or reset, timeouts, requests' errors
    FileUnavailable,  # storage could not serve a file now
    CommitFailedException,  # lost compare-and-swaps: contention, planned again later
    CommitStateUnknownException,
    ServerError,  # the REST catalog's 5xx
    ServiceUnavailableError,
    TooManyRequestsError,
    ServiceRequestError,  # Azure: the request was not sent, or no answer came
    ServiceResponseError,
    # The SQL catalog's database (SQLAlchemy wraps the driver's error): SQLite's "database is
    # locked" while another process writes, a server that cannot be reached or dropped the
    # connection, no connection free in the pool. None of them is about what is committed.
    OperationalError,
    DisconnectionError,
    PoolTimeoutError,
    TTransportException,  # the Hive catalog's metastore: unreachable, the connection lost
)


def is_outage(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, says that storage or the catalog could
    not answer now (unreachable, failing, throttling, a lost compare-and-swap), rather than that
    the request itself cannot go in."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OUTAGES):
            return True
        if isinstance(cause, HttpResponseError) and (
            cause.status_code is None or cause.status_code >= 500 or cause.status_code == 429
        ):
            return True
        cause = cause.__cause__ or cause.__context__
    return False
