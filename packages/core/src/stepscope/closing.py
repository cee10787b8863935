"""`with obj:` for stepscope's objects that hold threads, files or connections until
`close()`: the hooks, the writers, the progress bar, the job query."""

from __future__ import annotations

from typing import TypeVar

_Self = TypeVar("_Self", bound="ClosedOnExit")


class ClosedOnExit:
    """A base that makes `with obj:` give `obj` and close it at the block's end, however the
    block ends (an exception still propagates). The class defines `close()`."""

    def close(self) -> object:  # (what a close returns is its own: the writer says if all was published)
        raise NotImplementedError(f"{type(self).__name__} defines no close()")

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
