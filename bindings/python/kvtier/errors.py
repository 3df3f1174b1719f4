"""The exceptions of kvtier.

Every error of the SDK and the daemon is a kvtier.Error whose class names its stable error code
(docs/protocol.md): ``except kvtier.NotFound``, ``except kvtier.Full``. ``error.code`` is the
number, ``error.retryable`` says whether the same call may succeed later. Two conditions come
from Python itself: BufferInUse (no code) and UsedAfterFork (an InvalidArgument).
"""


class Error(Exception):
    """Base of every kvtier error."""

    code: int | None = None  #: the stable kvtier error code, None for Python-only conditions
    retryable: bool = False  #: True where the same call may succeed later


class InvalidArgument(Error, ValueError):
    """A bad argument: a range, a size, a shape or dtype, a token id, a layout field."""

    code = 1


class NotFound(Error, LookupError):
    """No such sequence, snapshot or entry."""

    code = 2


class Full(Error):
    """The pool has no block that can be evicted (everything pinned or in use)."""

    code = 3
    retryable = True


class NotSupported(Error):
    """Not supported for this layout, client or daemon (e.g. a GPU block without CUDA)."""

    code = 4


class StaleReference(Error):
    """A block reference whose block was reused since."""

    code = 5


class ChecksumMismatch(Error):
    """Bytes that failed their checksum."""

    code = 6


class PermissionDenied(Error):
    """The daemon refused this peer or tenant."""

    code = 7


class Unavailable(Error):
    """No daemon answered, the connection was lost, or a remote node did not answer in time."""

    code = 8
    retryable = True


class Conflict(Error):
    """Another writer holds the sequence."""

    code = 9
    retryable = True


class ProtocolMismatch(Error):
    """Client and daemon speak different protocol versions."""

    code = 10


class Internal(Error):
    """A bug in kvtier."""

    code = 11


class Released(Error):
    """A handle used after release, commit or abort; a client (or its objects) after close()."""

    code = 12


class UsedAfterFork(InvalidArgument):
    """An object made before fork() used in the child process: connect a new Client there.

    Its code is INVALID_ARGUMENT, as the C ABI's for the same misuse.
    """


class BufferInUse(Error, BufferError):
    """A release, commit, abort or close refused because arrays of the blocks are still alive.

    Nothing changed: delete the arrays, tensors or memoryviews of the handle's blocks (or copy
    what you keep) and try again.
    """


_BY_CODE: dict[int | None, type[Error]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Full,
        NotSupported,
        StaleReference,
        ChecksumMismatch,
        PermissionDenied,
        Unavailable,
        Conflict,
        ProtocolMismatch,
        Internal,
        Released,
    )
}


def error_class(code: int) -> type[Error]:
    """The exception class for a kvtier error code (Error for a code this version does not know)."""
    return _BY_CODE.get(code, Error)
