"""The socket test of a shaped link, run inside its namespaces before the jobs (standard library only:
started by path, `ip netns exec <ns> <python> link_probe.py serve|send ...`, it imports nothing of
dlbench).

    serve ADDRESS PORT             in worker 1's namespace: says "ready", then takes two connections:
                                   the first echoes every byte back (the round trips), the second is
                                   counted (the stream): prints {"bytes", "seconds"} from its first
                                   byte to its end, as received
    send ADDRESS PORT SECONDS N    in worker 0's namespace: N round trips of one byte (TCP_NODELAY),
                                   then a stream of SECONDS; prints {"rtt_s": [...], "sent"}

The bandwidth is the receiver's: bytes over the time from the first byte to the last, so what the
sender's buffers still held when it stopped counts, at the time it arrived. The round trip is the
median of the N (the first few include the connection's setup on the peer, so it is the median,
not the mean).
"""

from __future__ import annotations

import json
import socket
import sys
import time

CHUNK = 1 << 20


def serve(address: str, port: int) -> None:
    with socket.create_server((address, port), backlog=2) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:  # round trips: echo until the sender closes
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(64):
                conn.sendall(data)
        conn, _ = server.accept()
        with conn:
            received, first, last = 0, None, None
            while data := conn.recv(CHUNK):
                last = time.perf_counter()
                first = first if first is not None else last
                received += len(data)
        print(json.dumps({"bytes": received, "seconds": (last - first) if first is not None else 0.0}), flush=True)


def send(address: str, port: int, seconds: float, rounds: int) -> None:
    rtts = []
    with socket.create_connection((address, port), timeout=30) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            t0 = time.perf_counter()
            conn.sendall(b"x")
            if conn.recv(64) != b"x":
                raise RuntimeError("the echo came back wrong")
            rtts.append(time.perf_counter() - t0)
    payload = b"\0" * CHUNK
    sent = 0
    with socket.create_connection((address, port), timeout=30) as conn:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.sendall(payload)
            sent += len(payload)
    print(json.dumps({"rtt_s": rtts, "sent": sent}), flush=True)


if __name__ == "__main__":
    role, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "serve":
        serve(address, port)
    else:
        send(address, port, float(sys.argv[4]), int(sys.argv[5]))
