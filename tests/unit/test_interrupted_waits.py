"""The chat's main thread waits for its turn, its cancel and its leaving while Ctrl-C and
SIGTERM may land at any moment. ``Event.wait`` interrupted there, while another thread holds the
event's lock, left the lock in a broken state: the chat printed ``RuntimeError: release unlocked
lock`` instead of stopping its wait, or hung. ``waited`` polls instead; this puts it (in a
process of its own) under a storm of interrupts while another thread holds and releases the
event's lock without pause: every interrupt reaches the caller, nothing else is raised, and the
process finishes. The same storm against ``Event.wait`` hangs it within seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STORM = """
import signal, sys, threading, time
from terret.cli._chat_terminal import waited

class Interrupt(Exception):
    pass

armed = False

def land(signum, frame):
    global armed
    if armed:  # only inside the wait below: the loop's own lines are not under test
        armed = False
        raise Interrupt

signal.signal(signal.SIGALRM, land)
event, stop = threading.Event(), False

def hold_the_lock():
    while not stop:
        with event._cond:
            time.sleep(0.0005)

holder = threading.Thread(target=hold_the_lock, daemon=True)
holder.start()
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
interrupts = others = 0
end = time.monotonic() + 4.0
while time.monotonic() < end:
    try:
        armed = True
        waited(event, 0.002)
        armed = False
    except Interrupt:
        interrupts += 1
    except Exception as exc:
        armed = False
        others += 1
        print(repr(exc), file=sys.stderr)
signal.setitimer(signal.ITIMER_REAL, 0)
stop = True
holder.join()
event.set()
assert waited(event, 0.0)
print(interrupts, others)
"""


def test_a_wait_interrupted_without_pause_raises_only_the_interrupt() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", STORM], capture_output=True, text=True,
                          timeout=30, cwd=root)
    assert done.returncode == 0, done.stderr
    interrupts, others = map(int, done.stdout.split())
    assert interrupts > 100 and others == 0, (interrupts, others, done.stderr)
