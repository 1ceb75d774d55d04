"""What a call queued in a pipeline will answer (:class:`Pending`): its own value or error."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from .driver import Driver

T = TypeVar("T")


class Pending(Generic[T]):
    """What a call queued in a pipeline will answer: :meth:`result` gives its value or
    raises its own error, once the pipeline has been sent."""

    __slots__ = ("_driver", "_error", "_later", "_part", "_write")

    def __init__(self, driver: Driver[T] | None, write: bool = True) -> None:
        self._driver: Driver[Any] | None = driver
        self._error: BaseException | None = None
        self._write = write
        #: The answer of a blocked claim's wait after the round trip, when it waited.
        self._later: tuple[T] | None = None
        #: A call that shares one script with its neighbour (runops.fused): which of the
        #: driver's two answers is its own (None: the driver is its own).
        self._part: int | None = None

    def done(self) -> bool:
        """Whether the call has its answer (the pipeline was sent)."""
        return self._error is not None or (self._driver is not None
                                           and self._driver.over())

    def result(self) -> T:
        """The call's value, or raise its error (``Conflict``, ``Unavailable``...);
        ``RuntimeError`` before the pipeline was sent."""
        if self._error is not None:
            raise self._error
        if self._later is not None:
            return self._later[0]
        if self._driver is None or not self._driver.over():
            raise RuntimeError("the pipeline has not been sent yet: leave its with block "
                               "(or call send()) first")
        if self._part is not None:
            return self._driver.result()[self._part].unwrap()  # type: ignore[no-any-return]
        return self._driver.result()  # type: ignore[no-any-return]

    def _fail(self, error: BaseException) -> None:
        """Answer with ``error``, unless the call has its answer already."""
        if not self.done():
            self._error = error
