#!/usr/bin/env python3
"""A TCP proxy that makes a link: a one-way latency in each direction (a round trip of
2 x DELAY_MS), optionally jitter and a bandwidth cap, without netem (kernels without
sch_netem, e.g. this project's CI VMs).

  delay-proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS [--jitter MS] [--rate BYTES_PER_S]

Every chunk read on one side is written to the other in order, when it would have arrived
over the link: first serialised at --rate bytes per second (0, the default: no cap) behind
whatever that direction is already sending, then DELAY_MS (+- up to MS/2 of --jitter, never
overtaking an earlier chunk) on the way. The cap holds per direction for all the proxy's
connections together, as one link's would; a chunk is at most 16 KiB when capped, so a
transfer leaves in steps of at most 16 KiB / rate. No loss. Runs until killed. Used by
scripts/r1-sim.sh (--delay-via proxy); prints `listening on HOST:PORT` once ready.
Exit codes: 0 killed, 2 bad arguments.
"""

import argparse
import asyncio
import random
import sys


def parse_addr(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{s!r} is not HOST:PORT")
    return host, int(port)


class Direction:
    """One direction of the link: when its wire is free next, and the last chunk's arrival
    (so jitter never reorders)."""

    def __init__(self, delay, jitter, rate):
        self.delay, self.jitter, self.rate = delay, jitter, rate
        self.free = 0.0
        self.last_due = 0.0

    def due(self, now, size):
        """When a chunk of `size` bytes read at `now` reaches the other side."""
        sent = now
        if self.rate > 0:
            # Serialised after what this direction already carries.
            sent = max(now, self.free) + size / self.rate
            self.free = sent
        d = self.delay + (random.uniform(-self.jitter / 2, self.jitter / 2) if self.jitter else 0)
        self.last_due = max(self.last_due, sent + max(d, 0.0))
        return self.last_due


async def pump(reader, writer, link):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()
    chunk = 1 << 14 if link.rate > 0 else 1 << 16

    async def receive():
        try:
            while True:
                data = await reader.read(chunk)
                if not data:
                    break
                queue.put_nowait((link.due(loop.time(), len(data)), data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((None, None))

    async def send():
        try:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                writer.close()
            except OSError:
                pass

    await asyncio.gather(receive(), send())


async def main(listen, target, up, down):
    async def handle(client_r, client_w):
        try:
            up_r, up_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, up_w, up), pump(up_r, client_w, down))

    server = await asyncio.start_server(handle, *listen)
    print(f"listening on {listen[0]}:{listen[1]}", flush=True)
    async with server:
        await server.serve_forever()


def non_negative(s):
    v = float(s)
    if not v >= 0:  # also refuses nan
        raise ValueError(f"{s!r} is negative")
    return v


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="a TCP link with delay, jitter and a rate cap")
    ap.add_argument("listen", type=parse_addr, help="HOST:PORT to listen on")
    ap.add_argument("target", type=parse_addr, help="HOST:PORT to forward to")
    ap.add_argument("delay_ms", type=non_negative, help="one-way delay, milliseconds")
    ap.add_argument("--jitter", type=non_negative, default=0.0,
                    help="one-way delay varies by up to +- half of this, milliseconds")
    ap.add_argument("--rate", type=non_negative, default=0.0,
                    help="bytes per second per direction (0: no cap)")
    args = ap.parse_args()  # exits 2 on bad arguments
    link = lambda: Direction(args.delay_ms / 1000.0, args.jitter / 1000.0, args.rate)
    try:
        asyncio.run(main(args.listen, args.target, link(), link()))
    except KeyboardInterrupt:
        pass
