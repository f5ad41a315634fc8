#!/usr/bin/env python3
"""A TCP proxy that adds a fixed one-way latency in each direction: a link of round trip
2 x DELAY_MS without netem (kernels without sch_netem, e.g. this project's CI VMs).

  delay-proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS

Every chunk read on one side is written to the other DELAY_MS after it arrived, in order
(a pure latency model: no bandwidth limit, no loss). Runs until killed. Used by
scripts/r1-sim.sh (--delay-via proxy); prints `listening on HOST:PORT` once ready.
Exit codes: 0 killed, 2 bad arguments.
"""

import asyncio
import sys


def parse_addr(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{s!r} is not HOST:PORT")
    return host, int(port)


async def pump(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def receive():
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                queue.put_nowait((loop.time() + delay, data))
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


async def main(listen, target, delay):
    async def handle(client_r, client_w):
        try:
            up_r, up_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, up_w, delay), pump(up_r, client_w, delay))

    server = await asyncio.start_server(handle, *listen)
    print(f"listening on {listen[0]}:{listen[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        listen, target = parse_addr(sys.argv[1]), parse_addr(sys.argv[2])
        delay = float(sys.argv[3]) / 1000.0
        if delay < 0:
            raise ValueError("negative delay")
    except (IndexError, ValueError) as e:
        print(f"usage: delay-proxy.py LISTEN:PORT TARGET:PORT DELAY_MS ({e})", file=sys.stderr)
        sys.exit(2)
    try:
        asyncio.run(main(listen, target, delay))
    except KeyboardInterrupt:
        pass
