"""The GIL is released while compiled code runs (two threads run at
once), Ctrl-C interrupts a long call, and what programs print goes to
sys.stdout."""

import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import adjoint

WORK = """
fn work(n: i64, x) {
    let mut acc = x;
    for i in 0..n { acc = sin(acc) * 0.999 + 0.001 * cos(acc); }
    acc
}
"""


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_two_threads_run_compiled_code_at_once(mode):
    m = adjoint.loads(WORK, mode=mode)
    # About half a second of compiled work per call.
    n = 1000
    while True:
        m.work(n, 0.5)  # compiles (the int argument is part of the signature)
        t = timed(lambda: m.work(n, 0.5))
        if t > 0.3 or n > 10**9:
            break
        n = int(n * min(100, max(2, 0.5 / max(t, 1e-6))))
    expected = m.work(n, 0.5)

    def pair(job, want):
        starts, ends, results = [], [], []

        def worker():
            starts.append(time.perf_counter())
            results.append(job())
            ends.append(time.perf_counter())

        ts = [threading.Thread(target=worker) for _ in range(2)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        both = time.perf_counter() - t0
        if want is not None:
            assert results == [want, want]
        # Each call started before the other ended: with the GIL held
        # through a call, the second thread could not even start its call.
        assert max(starts) < min(ends), (starts, ends)
        return both

    # Two calls one after the other against two threads at once, next to
    # the same for hashing (which releases the GIL in CPython), all
    # measured together so that other work on the machine weighs on them
    # alike. On two free cores both take about half the serial time; on a
    # busy machine neither can do better than it lets them.
    data = b"x" * (64 << 20)
    ref_serial = timed(lambda: (hashlib.sha256(data).digest(), hashlib.sha256(data).digest()))
    reps = max(1, int(0.5 / max(ref_serial / 2, 1e-3)))
    hash_job = lambda: [hashlib.sha256(data).digest() for _ in range(reps)]
    tries = []
    for _ in range(3):
        serial = timed(lambda: (m.work(n, 0.5), m.work(n, 0.5)))
        both = pair(lambda: m.work(n, 0.5), expected)
        ref_serial = timed(lambda: (hash_job(), hash_job()))
        ref_both = pair(hash_job, None)
        tries.append((both / serial, ref_both / ref_serial))
        if both / serial < 0.8:
            break
    ratio, ref = min(tries)
    print(f"{mode}: two calls on two threads take {ratio:.2f} of their time in turn "
          f"(hashing: {ref:.2f}); {tries}")
    if ratio >= max(0.8, ref + 0.15) and os.getloadavg()[0] > (os.cpu_count() or 1):
        # Other processes hold the cores: two threads cannot be faster
        # than one (the calls did overlap, which `pair` checked).
        pytest.skip(f"the machine is too busy to measure a speed-up: load "
                    f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {tries}")
    if mode == "eager":
        # Eager mode runs the loop in the VM one 0-d tensor at a time, and
        # the two threads share the program's constant values: measured on
        # an idle two-core machine, two threads take 0.7-1.3 of the serial
        # time (docs/python.md). The calls overlap (checked above); the
        # speed-up is asserted for graph mode, where the loop is native.
        return
    assert ratio < max(0.8, ref + 0.15), tries


def test_python_threads_run_while_a_call_runs():
    m = adjoint.loads(WORK)
    m.work(10, 0.5)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    m.work(20_000_000, 0.5)
    stop.set()
    t.join()
    # Python code kept running on the other thread during the call.
    assert len(ticks) > 20


@pytest.mark.parametrize("which", ["native", "vm"])
def test_ctrl_c_interrupts_a_long_call(which):
    # A call that never ends: a native loop (graph mode compiles the
    # recursion to a scalar loop) or the VM's interpreter loop (eager).
    script = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        import adjoint
        src = "fn spin(n) = if n < 0 {{ n }} else {{ spin(n + 1) }}\\nfn sq(x) = x * x\\n"
        m = adjoint.loads(src, mode={"'graph'" if which == "native" else "'eager'"})
        # Compiled first (float arguments are not part of the signature),
        # so that the signal comes while the loop runs.
        m.spin(-1.0)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t = time.perf_counter()
        try:
            m.spin(0.0)
            print("returned")
        except KeyboardInterrupt:
            print("KeyboardInterrupt", round(time.perf_counter() - t, 1))
        # Later calls run normally.
        print("after", m.sq(3.0))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0].startswith("KeyboardInterrupt"), out.stdout + out.stderr
    assert float(lines[0].split()[1]) < 5.0
    assert lines[1] == "after 9.0"


def test_a_python_sigint_handler_still_runs():
    script = textwrap.dedent("""
        import os, signal, threading
        import adjoint
        m = adjoint.loads("fn spin(n) = if n < 0 { n } else { spin(n + 1) }\\n")
        class Stop(Exception):
            pass
        def handler(sig, frame):
            raise Stop()
        signal.signal(signal.SIGINT, handler)
        m.spin(-1.0)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            m.spin(0.0)
        except Stop:
            print("handler ran")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "handler ran", out.stdout + out.stderr


def test_what_a_program_prints_goes_to_sys_stdout(capsys):
    m = adjoint.loads('fn noisy(x) {\n    print("x is", x);\n    print("twice", x * 2.0);\n    x\n}\n')
    assert m.noisy(np.float32(1.5)) == 1.5
    assert capsys.readouterr().out == "x is 1.5\ntwice 3.0\n"
