"""``--store`` URIs the CLI cannot use are usage errors (exit 2, one ``Error: <Type>:`` line) at
once: a bad port is not retried as an unreachable server, and a password the URI cannot hold
unencoded shows in no part."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import invoke_cli, one_line_error, subprocess_env
from tests.support.esdb_emulator import EsdbEmulator

BAD_PORTS = [
    ("esdb://host:notaport?Tls=false", "esdb://host:***?Tls=false", "host"),
    ("esdb://admin:changeit@host:21x3?Tls=true", "esdb://***@host:21x3?Tls=true", "host"),
    # A number out of range is shown as written: no password looks like that to hide.
    ("esdb://a:2113,b:99999?Tls=false", "esdb://a:2113,b:99999?Tls=false", "b"),
    ("esdb://127.0.0.1:0?Tls=false", "esdb://127.0.0.1:0?Tls=false", "127.0.0.1"),
]


@pytest.mark.parametrize("uri, masked, host", BAD_PORTS)
def test_a_bad_port_is_a_usage_error_at_once(uri: str, masked: str, host: str) -> None:
    started = time.monotonic()
    result = invoke_cli("--store-timeout", "30", "--store", uri, "sessions", "list")
    assert result.exit_code == 2, result.stderr
    assert time.monotonic() - started < 5.0  # not retried for --store-timeout
    line = one_line_error(result.stderr)
    assert line == (
        f"Error: BadParameter: Invalid value for '--store': invalid EventStoreDB URI "
        f"{masked!r}: the port of host {host!r} is not a number from 1 to 65535"
        + ("" if "@" in uri or "***" not in masked
           else " (not shown: it may be a password, '@host' forgotten)")
        + "; write host:port, e.g. localhost:2113"
    )
    assert "changeit" not in result.stdout + result.stderr


@pytest.mark.parametrize("uri", ["esdb://admin:changeit@:2113?Tls=false", "esdb://:2113",
                                 "esdb://a:2113,:2114?Tls=false"])
def test_a_missing_host_is_a_usage_error_at_once(uri: str) -> None:
    """It was retried for --store-timeout as an unreachable server, then StoreUnavailable."""
    started = time.monotonic()
    result = invoke_cli("--store-timeout", "30", "--store", uri, "sessions", "list")
    assert result.exit_code == 2, result.stderr
    assert time.monotonic() - started < 5.0
    assert "a host name is missing" in one_line_error(result.stderr)
    assert "changeit" not in result.stdout + result.stderr


PASSWORDS = ["hunter2?x=SECRET", "SEC#RET?x=y", "SEC/RET?x=y", "SEC@RET", "123?x=SECRET",
             "2113/SECRET", "a?b@c/d#e=SECRET:f"]
SHAPES = ["esdb://admin:{pw}@host:2113?Tls=false",
          "esdb+discover://admin:{pw}@cluster.example:2113?Tls=true",
          "esdb://admin:{pw}@host:2113?Tls=true&TlsCaFile=/certs/ca@2024.pem"]


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_no_part_of_an_unencoded_password_is_shown(shape: str, password: str) -> None:
    uri = shape.format(pw=password)
    result = invoke_cli("--store-timeout", "30", "--store", uri, "sessions", "list")
    assert result.exit_code == 2, result.stderr
    line = one_line_error(result.stderr)
    assert line.startswith("Error: BadParameter: Invalid value for '--store': invalid EventStoreDB")
    assert "***@" in line
    rest = uri.replace(f"admin:{password}", "")
    for word in re.findall(r"[A-Za-z0-9]{3,}", f"admin:{password}"):
        if word not in rest:
            assert word not in result.stdout + result.stderr, (uri, result.stderr)


def test_a_tls_mismatch_is_one_clean_error_line(tmp_path: Path) -> None:
    """`Tls=true` against a plain-text server: one `Error:` line naming the TLS handshake —
    no gRPC core log lines (`absl::InitializeLog`, `I0000 … ssl_transport_security`) before it,
    no `_MultiThreadedRendezvous … debug_error_string` dump in it, no password."""
    emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
    try:
        port = emulator.uri.split(":")[2].split("?")[0]
        uri = f"esdb://admin:hunter2secret@127.0.0.1:{port}?Tls=true"
        env = {k: v for k, v in subprocess_env().items() if k != "GRPC_VERBOSITY"}
        done = subprocess.run([sys.executable, "-m", "terret", "--store", uri,
                               "--store-timeout", "2", "sessions", "list"], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, env=env)
    finally:
        emulator.stop()
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: StoreUnavailable:") and "TLS handshake failed" in lines[0]
    for noise in ("_MultiThreadedRendezvous", "debug_error_string", "hunter2secret"):
        assert noise not in done.stderr
