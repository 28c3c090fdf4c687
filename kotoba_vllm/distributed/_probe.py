"""Receiver-verified link transfers (the I/O shell of the link evidence).

Wire: the sender sends an 8-byte big-endian length N, then N bytes, then half-closes.
The receiver counts payload bytes and times its reads on its own clock, and answers
with 24 bytes: bytes counted, bytes inside the timed window, nanoseconds elapsed.
Mbit/s is computed only from those receiver numbers. A transfer whose count falls short of N (the
seed's macOS `nc` case: 133,120 of 16,777,216 bytes, sender exit 0) or that gets no
answer is recorded with its failure and no speed; the sender's clock is never used.
"""

from __future__ import annotations

import datetime as _dt
import socket
import struct
import time

from ._spec import Kw, LinkObservation

_HEADER = struct.Struct(">Q")
_ACK = struct.Struct(">QQQ")  # bytes counted, bytes inside the timed window, ns elapsed
_CHUNK = 1 << 20


def speed_mbps(counted: int, elapsed_ns: int) -> float | None:
    """Mbit/s from receiver-counted bytes and receiver time; None when time is not measurable."""
    if counted <= 0 or elapsed_ns <= 0:
        return None
    return counted * 8 / (elapsed_ns / 1e9) / 1e6


def observation(frm: str, to: str, expected: int, counted: int, elapsed_ns: int,
                timed: int | None = None, failure: str | None = None) -> LinkObservation:
    """The one place a transfer becomes evidence; pure, so the gate is testable without sockets."""
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    ms = round(elapsed_ns / 1e6, 3)
    if failure is None and counted != expected:
        failure = f"short transfer: receiver counted {counted} of {expected} bytes"
    mbps = None if failure is not None else speed_mbps(counted if timed is None else timed, elapsed_ns)
    if failure is None and mbps is None:
        failure = "receiver could not time the transfer"
    return LinkObservation(from_=frm, to=to, method=Kw("receiver-verified"),
                           mbps=None if mbps is None else round(mbps, 3), bytes=counted,
                           expected_bytes=expected, ms=ms, failure=failure, at=now)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def receive_one(listener: socket.socket, timeout: float = 60.0) -> tuple[int, int, int, int]:
    """Accept one transfer; returns (expected, counted, timed, elapsed_ns) and acks the sender."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(timeout)
        head = _recv_exact(conn, _HEADER.size)
        expected = _HEADER.unpack(head)[0] if len(head) == _HEADER.size else 0
        counted, first, last, first_n = 0, 0, 0, 0
        buf = bytearray(_CHUNK)
        try:
            while counted < expected:
                n = conn.recv_into(buf, min(_CHUNK, expected - counted))
                if n == 0:
                    break
                last = time.perf_counter_ns()
                if counted == 0:
                    # The first read already holds bytes that crossed the link before the
                    # clock started; the speed counts only bytes after it.
                    first = last
                    first_n = n
                counted += n
        except OSError:
            pass
        timed = counted - first_n if counted else 0
        elapsed = last - first if timed > 0 else 0
        try:
            conn.sendall(_ACK.pack(counted, timed, elapsed))
        except OSError:
            pass
        return expected, counted, timed, elapsed


def listen(port: int, host: str = "0.0.0.0") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(1)
    return s


def send(host: str, port: int, nbytes: int, frm: str = "sender", to: str = "receiver",
         timeout: float = 60.0) -> LinkObservation:
    """Send `nbytes` and return the observation built from the receiver's own count."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(_HEADER.pack(nbytes))
            block = b"\x5a" * min(_CHUNK, max(nbytes, 1))
            left = nbytes
            while left > 0:
                k = min(left, len(block))
                s.sendall(block[:k])
                left -= k
            s.shutdown(socket.SHUT_WR)
            ack = _recv_exact(s, _ACK.size)
    except OSError as e:
        return observation(frm, to, nbytes, 0, 0, failure=f"transfer failed: {e}")
    if len(ack) < _ACK.size:
        return observation(frm, to, nbytes, 0, 0, failure="receiver sent no count: nothing verified")
    counted, timed, elapsed = _ACK.unpack(ack)
    return observation(frm, to, nbytes, counted, elapsed, timed=timed)
