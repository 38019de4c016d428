"""A worker-like process for tests/test_reaped_message_acked_late.py: it installs its
holder (heartbeat) as a worker's main process does and takes messages through the fleet's
broker transport (workers.broker: QoS records them under its holder).

Commands on stdin, one a line: ``get`` (take one message of queue ``proxies``, print its
delivery tag), ``ack`` (acknowledge the last message taken), ``reap`` (run the QoS sweep that
puts back dead holders' messages, every 0.3 s until stdin closes or ``stop``).
"""

from __future__ import annotations

import sys
import threading
import time


def main(url: str) -> None:
    from workers import broker

    broker.install()
    from kombu import Connection, Exchange, Queue

    from app.store import holders

    holder = holders.install(url)
    print("holder", holder.id, flush=True)
    q = Queue("proxies", Exchange("proxies", type="direct"), routing_key="proxies")
    conn = Connection(url)
    ch = conn.channel()
    bound = q(ch)
    bound.declare()
    last = None
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "get":
            for _ in range(100):
                last = bound.get(no_ack=False)
                if last is not None:
                    break
                time.sleep(0.05)
            print("tag", last.delivery_tag if last else None, flush=True)
        elif cmd == "ack":
            last.ack()
            print("acked", flush=True)
        elif cmd == "reap":
            stop = threading.Event()

            def loop(stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    ch.qos.restore_visible()
                    time.sleep(0.3)

            threading.Thread(target=loop, daemon=True).start()
            print("reaping", flush=True)
        elif cmd == "exit":
            return


if __name__ == "__main__":
    main(sys.argv[1])
