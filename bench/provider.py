"""Benchmark: how much the provider's SSE parsing adds on top of reading the same bytes.

A real local HTTP server (the one the tests use, in a child process so that it does not share
the GIL with the client being measured) streams a 2,000-chunk OpenRouter-shaped reply, each
chunk written and flushed on its own as a real server does. In one run, alternating, we
time (a) httpx alone reading the body with ``iter_bytes()`` and (b) the provider's
``complete()`` parsing it into a reply with text passed to ``on_text``. Several repetitions;
the figure is the ratio of the median wall times. The client's CPU-time ratio is printed too:
on a machine shared with other work, wall times are noisy and it shows the parsing cost alone.

    .venv/bin/python bench/provider.py [--chunks 2000] [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from terret.adapters.providers import OpenAICompatibleProvider, RetryConfig  # noqa: E402
from terret.adapters.providers.wire import request_body  # noqa: E402
from terret.domain.messages import Message  # noqa: E402
from terret.runtime.model import ModelRequest  # noqa: E402
from tests.support.sse_server import Reply, ScriptedServer, text_stream  # noqa: E402

PATH = "/v1/chat/completions"
TARGET = 1.5


def serve(chunks: int) -> None:
    """Child process: serve the stream until stdin closes."""
    with ScriptedServer() as server:
        server.repeat(PATH, Reply.sse(text_stream(pieces(chunks))))
        print(server.url, flush=True)
        sys.stdin.read()


def pieces(chunks: int) -> list[str]:
    return [f"tok{i % 97} " for i in range(chunks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.chunks)
        return

    size = sum(len(part) for part in text_stream(pieces(args.chunks)))
    request = ModelRequest(model="bench/model", messages=(Message("user", "go"),))
    body = request_body(request, stream_usage=True)
    expected = "".join(pieces(args.chunks))

    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--chunks", str(args.chunks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        base_url = child.stdout.readline().strip() + "/v1"
        times = measure(base_url, body, request, expected, args.chunks, args.reps)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)

    raw_median = statistics.median(times["raw"])
    parsed_median = statistics.median(times["parsed"])
    ratio = parsed_median / raw_median
    paired = statistics.median(p / r for p, r in zip(times["parsed"], times["raw"], strict=True))
    cpu_ratio = statistics.median(times["parsed_cpu"]) / statistics.median(times["raw_cpu"])
    print(f"stream: {args.chunks} chunks, {size} bytes, {args.reps} repetitions (medians)")
    print(f"raw httpx iter_bytes  : {raw_median * 1000:8.2f} ms wall")
    print(f"provider.complete     : {parsed_median * 1000:8.2f} ms wall")
    print(f"median of pair ratios : {paired:8.2f} x wall")
    print(f"client CPU-time ratio : {cpu_ratio:8.2f} x (steadier on a shared machine)")
    print(f"parse throughput      : {args.chunks / parsed_median:,.0f} chunks/s")
    print(f"figure: provider_vs_raw_httpx = {ratio:.2f} x (target <= {TARGET})")


def measure(
    base_url: str, body: bytes, request: ModelRequest, expected: str, chunks: int, reps: int
) -> dict[str, list[float]]:
    """Wall and CPU seconds per run: ``raw``, ``parsed``, ``raw_cpu``, ``parsed_cpu``."""
    raw_client = httpx.Client(timeout=30.0)
    provider = OpenAICompatibleProvider(
        "bench", base_url, api_key="bench-key", retry=RetryConfig(max_retries=0)
    )
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench-key"}
    url = base_url + "/chat/completions"

    def raw() -> None:
        with raw_client.stream("POST", url, content=body, headers=headers) as response:
            for _ in response.iter_bytes():
                pass

    def parsed() -> None:
        sink: list[str] = []
        reply = provider.complete(request, on_text=sink.append)
        assert reply.text == expected and len(sink) == chunks
        assert reply.usage is not None

    try:
        for _ in range(3):  # warm up connections, caches and the allocator
            raw()
            parsed()
        times: dict[str, list[float]] = {"raw": [], "parsed": [], "raw_cpu": [], "parsed_cpu": []}
        pairs = [("raw", raw), ("parsed", parsed)]
        for rep in range(reps):
            # Back to back, order alternating, so that a burst of load on a shared machine
            # falls on both sides of a pair rather than on one side of the figure.
            for name, fn in pairs if rep % 2 == 0 else pairs[::-1]:
                cpu, wall = time.process_time(), time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - wall)
                times[name + "_cpu"].append(time.process_time() - cpu)
        return times
    finally:
        raw_client.close()
        provider.close()


if __name__ == "__main__":
    main()
