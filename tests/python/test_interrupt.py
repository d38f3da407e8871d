"""Ctrl-C stops a call that would not end, in every policy, and the engine
goes on serving calls afterwards (support/interrupt.h)."""
import os
import signal
import threading
import time

import pytest

import pejit

SPIN = """
def @spin(%x: Tensor[(), f32]) -> Tensor[(), f32] {
  if (greater(%x, 0f32)) { @spin(add(%x, 1f32)) } else { %x }
}
"""


@pytest.mark.parametrize("policy", ["interpreter", "eager", "sync"])
def test_ctrl_c_stops_a_call_that_would_not_end(policy):
    with pejit.Engine(policy=policy) as engine:
        engine.module.add_source(SPIN, "spin.pj")
        spin = engine.entry("spin")
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            spin(1.0)  # counts up for ever
        timer.join()
        assert time.monotonic() - start < 30
        assert spin(-1.0) == -1.0  # still serving
