"""The Work a ringccl call returns to torch, and Works made of others."""

import datetime
import time

import torch
import torch.distributed as dist

_NO_TIMEOUT = datetime.timedelta(0)


def _error(message):
    return dist.DistBackendError(message)


class _Work(dist._Work):
    """A call's handle: finished already (a synchronous call: no future is made unless
    asked for), or completed by the group's worker through `future`.

    torch wraps a Python backend's Work in a holder that passes on only `wait` and
    `get_future`: from user code, `work.is_completed()` stays False; ask
    `work.get_future().done()` instead."""

    def __init__(self, result, future=None):
        super().__init__()
        self._result = result
        self._future = future

    def wait(self, timeout=_NO_TIMEOUT):
        future = self._future
        if future is None:
            return True
        if timeout is not None and timeout != _NO_TIMEOUT and not future.done():
            limit = time.monotonic() + timeout.total_seconds()
            pause = 1e-5
            while not future.done():
                if time.monotonic() >= limit:
                    raise _error(
                        f"ringccl: the call did not finish within {timeout.total_seconds():g} s "
                        "(the timeout given to wait)"
                    )
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
        future.wait()  # raises the call's error
        return True

    def is_completed(self):
        return self._future is None or self._future.done()

    def is_success(self):
        return self.exception() is None

    def exception(self):
        if self._future is None or not self._future.done():
            return None
        try:
            self._future.wait()
        except Exception as error:
            return error
        return None

    def result(self):
        return self._result

    def get_future(self):
        if self._future is None:
            future = torch.futures.Future()
            future.set_result(self._result)
            self._future = future
        return self._future


def _last(works, result):
    """One Work standing for several issued in order, done when all are."""
    futures = [w.get_future() for w in works]

    def done(collected):
        for future in collected.value():
            future.value()  # raises the first failure
        return result

    return _Work(result, torch.futures.collect_all(futures).then(done))


def _then(work, step, result):
    """`work`, with `step` run once its data has arrived (before it counts as done)."""

    def chained(done):
        done.value()  # raises the call's failure
        step()
        return result

    return _Work(result, work.get_future().then(chained))
