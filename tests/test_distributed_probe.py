"""Probe: speed only from what the receiver counted; a short transfer is a failure, not a speed."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading

from kotoba_vllm._edn import kw, read_one
from kotoba_vllm.distributed import _probe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_loopback_transfer_is_receiver_verified() -> None:
    lst = _probe.listen(0, "127.0.0.1")
    port = lst.getsockname()[1]
    got: list = []
    t = threading.Thread(target=lambda: got.append(_probe.receive_one(lst, 10)))
    t.start()
    obs = _probe.send("127.0.0.1", port, 32 * 1024 * 1024, "a", "b", 10)
    t.join(10)
    lst.close()
    assert obs.failure is None and obs.mbps is not None and obs.mbps > 0
    assert obs.bytes == obs.expected_bytes == 32 * 1024 * 1024
    assert got[0][1] == 32 * 1024 * 1024


def test_short_transfer_is_recorded_as_failure_never_as_speed() -> None:
    # The seed's macOS nc: 133,120 of 16,777,216 bytes arrived, the sender exited 0 in 8 ms.
    obs = _probe.observation("a", "b", 16_777_216, 133_120, 8_000_000)
    assert obs.mbps is None and obs.failure is not None and "133120 of 16777216" in obs.failure
    assert _probe.observation("a", "b", 100, 100, 0).mbps is None  # untimeable: no speed either


def test_sender_that_gets_no_receiver_count_records_failure() -> None:
    # A "receiver" that reads a little and hangs up without counting.
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)

    def rude() -> None:
        c, _ = lst.accept()
        c.recv(1000)
        c.close()

    t = threading.Thread(target=rude)
    t.start()
    obs = _probe.send("127.0.0.1", lst.getsockname()[1], 8 * 1024 * 1024, timeout=5)
    t.join(5)
    lst.close()
    assert obs.mbps is None and obs.failure


def test_receiver_counts_a_sender_that_stops_early() -> None:
    lst = _probe.listen(0, "127.0.0.1")
    got: list = []
    t = threading.Thread(target=lambda: got.append(_probe.receive_one(lst, 5)))
    t.start()
    with socket.create_connection(("127.0.0.1", lst.getsockname()[1])) as s:
        s.sendall(struct.pack(">Q", 1_000_000) + b"x" * 4096)  # claims 1 MB, sends 4 KiB
        s.shutdown(socket.SHUT_WR)
        ack = s.recv(24)
    t.join(5)
    lst.close()
    counted = struct.unpack(">QQQ", ack)[0]
    assert counted == 4096
    obs = _probe.observation("a", "b", *got[0][:2], got[0][3], timed=got[0][2])
    assert obs.mbps is None and "4096 of 1000000" in (obs.failure or "")


def test_cli_probe_links_records_into_a_spec(tmp_path) -> None:
    port = _free_port()
    spec = tmp_path / "s.edn"
    spec.write_text(open("examples/distributed/two-node-llamacpp-rpc.edn").read())
    rx = subprocess.Popen([sys.executable, "-m", "kotoba_vllm", "probe-links", "--listen", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The receiver says when it listens; waiting for that line (not a fixed sleep) holds on a loaded machine.
        assert rx.stderr is not None
        assert rx.stderr.readline().startswith(f"listening on {port}")
        r = subprocess.run([sys.executable, "-m", "kotoba_vllm", "probe-links", "--send", f"127.0.0.1:{port}",
                            "--bytes", str(16 * 1024 * 1024), "--spec", str(spec), "--boundary", "head:worker",
                            "--in-place"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        obs = read_one(r.stdout)
        assert obs[kw("link/method")] == kw("receiver-verified") and obs[kw("link/mbps")] > 0
        links = read_one(spec.read_text())[kw("dist/links")]
        assert links[-1][kw("link/from")] == "head" and links[-1][kw("link/bytes")] == 16 * 1024 * 1024
        out, _ = rx.communicate(timeout=10)
        assert read_one(out)[kw("link/bytes")] == 16 * 1024 * 1024
    finally:
        if rx.poll() is None:
            rx.kill()
