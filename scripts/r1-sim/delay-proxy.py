#!/usr/bin/env python3
"""TCP proxies that make links: a one-way latency in each direction (a round trip of
2 x DELAY_MS), optionally jitter, a bandwidth cap per link and a bus all the links share,
without netem (kernels without sch_netem, e.g. this project's CI VMs).

  delay-proxy.py DELAY_MS LISTEN_HOST:PORT=TARGET_HOST:PORT [...] [--jitter MS]
                 [--rate BYTES_PER_S] [--bus BYTES_PER_S]

One link per LISTEN=TARGET pair, all in this process. Every chunk read on one side is written
to the other in order, when it would have arrived: first serialised at --rate bytes per
second behind whatever that direction of that link already sends (per link, per direction,
all its connections together), then on the bus at --bus bytes per second behind whatever
any link sends in either direction (a USB 2.0 hub: one half-duplex bus for every device on
it), then DELAY_MS (+- up to MS/2 of --jitter, never overtaking an earlier chunk) on the way.
A connection that comes from another address than the one it reached (a node calling the
next node's link, not the host) pays the bus twice: on USB its bytes go up to the host and
down again. 0 (the default) for --rate or --bus: no cap. Chunks are at most 16 KiB when
capped, so a transfer leaves in steps of at most 16 KiB / rate. No loss. Runs until killed.
With --counts FILE, the bytes each link carried are kept in FILE (JSON, rewritten at most every
0.2 s): `{"PORT": {"host": [up, down], "node": [up, down]}}` per listening port, split by who
opened the connection (the host, e.g. a gateway, or another node) and by direction (up: toward
the node behind the link). Used by scripts/r1-sim.sh (--delay-via proxy); prints `listening on
HOST:PORT` for each link once ready. Exit codes: 0 killed, 2 bad arguments.
"""

import argparse
import asyncio
import json
import os
import random

# (listening port, "host" | "node") -> [bytes up, bytes down]; written by --counts.
COUNTS = {}


def parse_addr(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{s!r} is not HOST:PORT")
    return host, int(port)


def parse_pair(s):
    listen, sep, target = s.partition("=")
    if not sep:
        raise ValueError(f"{s!r} is not LISTEN=TARGET")
    return parse_addr(listen), parse_addr(target)


class Wire:
    """A serialiser: when it is free next."""

    def __init__(self, rate):
        self.rate = rate
        self.free = 0.0

    def carry(self, t, size):
        """When `size` bytes ready at `t` have crossed it."""
        if self.rate <= 0:
            return t
        self.free = max(t, self.free) + size / self.rate
        return self.free


class Direction:
    """One direction of one link: its own wire, the shared bus, the delay, and the last
    chunk's arrival (so jitter never reorders)."""

    def __init__(self, delay, jitter, rate, bus):
        self.delay, self.jitter = delay, jitter
        self.wire, self.bus = Wire(rate), bus
        self.last_due = 0.0

    def due(self, now, size, bus_trips):
        """When a chunk of `size` bytes read at `now` reaches the other side."""
        sent = self.bus.carry(self.wire.carry(now, size), size * bus_trips)
        d = self.delay + (random.uniform(-self.jitter / 2, self.jitter / 2) if self.jitter else 0)
        self.last_due = max(self.last_due, sent + max(d, 0.0))
        return self.last_due


async def pump(reader, writer, link, bus_trips, tally=None):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()
    capped = link.wire.rate > 0 or link.bus.rate > 0
    chunk = 1 << 14 if capped else 1 << 16

    async def receive():
        try:
            while True:
                data = await reader.read(chunk)
                if not data:
                    break
                if tally is not None:
                    tally[0][tally[1]] += len(data)
                queue.put_nowait((link.due(loop.time(), len(data), bus_trips), data))
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


async def serve(listen, target, up, down):
    async def handle(client_r, client_w):
        peer = client_w.get_extra_info("peername")
        # A node calling through the host: up the bus and down again.
        trips = 1 if peer and peer[0] == listen[0] else 2
        try:
            up_r, up_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        c = COUNTS.setdefault((listen[1], "host" if trips == 1 else "node"), [0, 0])
        await asyncio.gather(pump(client_r, up_w, up, trips, (c, 0)),
                             pump(up_r, client_w, down, trips, (c, 1)))

    server = await asyncio.start_server(handle, *listen)
    print(f"listening on {listen[0]}:{listen[1]}", flush=True)
    async with server:
        await server.serve_forever()


async def write_counts(path):
    """Keeps `path` up to date with COUNTS (atomically: a reader never sees half a file)."""
    last = None
    while True:
        now = {}
        for (port, who), ud in COUNTS.items():
            now.setdefault(str(port), {})[who] = list(ud)
        text = json.dumps(now, sort_keys=True)
        if text != last:
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
            last = text
        await asyncio.sleep(0.2)


async def main(args):
    bus = Wire(args.bus)
    if args.counts:
        asyncio.get_running_loop().create_task(write_counts(args.counts))

    def direction():
        return Direction(args.delay_ms / 1000.0, args.jitter / 1000.0, args.rate, bus)

    await asyncio.gather(*(serve(l, t, direction(), direction()) for l, t in args.links))


def non_negative(s):
    v = float(s)
    if not v >= 0:  # also refuses nan
        raise ValueError(f"{s!r} is negative")
    return v


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="TCP links with delay, jitter, rate caps and a bus")
    ap.add_argument("delay_ms", type=non_negative, help="one-way delay, milliseconds")
    ap.add_argument("links", type=parse_pair, nargs="+", metavar="LISTEN=TARGET",
                    help="HOST:PORT to listen on = HOST:PORT to forward to")
    ap.add_argument("--jitter", type=non_negative, default=0.0,
                    help="one-way delay varies by up to +- half of this, milliseconds")
    ap.add_argument("--rate", type=non_negative, default=0.0,
                    help="bytes per second per link and direction (0: no cap)")
    ap.add_argument("--bus", type=non_negative, default=0.0,
                    help="bytes per second for all links and directions together (0: no cap)")
    ap.add_argument("--counts", metavar="FILE", help="keep the bytes each link carried in FILE (JSON)")
    args = ap.parse_args()  # exits 2 on bad arguments
    try:
        asyncio.run(main(args))
    except KeyboardInterrupt:
        pass
