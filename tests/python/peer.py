"""The peer process of the Python tests (started with multiprocessing 'spawn').

It owns an engine and a zeroed 1 MiB target region, reports (address,
descriptor) pickled, then serves commands from the parent:

  ("count", imm)                      create an ImmCounter for imm (before the parent sends)
  ("wait", imm, n, timeout, off, len) wait for n arrivals; reply with buf[off:off+len]
  ("dump", off, len)                  reply with buf[off:off+len]
  ("clear",)                          zero the region
  ("recv", n, timeout)                reply with the next n received messages (bytes)
  ("send", addr, data)                submit_send to the parent; reply when done
  ("write", desc, data, off, imm)     register data and write it into desc at off
  ("imm", desc, imm)                  submit_imm
  ("stop",)                           stop the engine and exit
"""

from __future__ import annotations

import queue
import traceback

SIZE = 1 << 20
PROVIDERS = {"tcp": ("tcp;ofi_rxm", ["lo"]), "shm": ("shm", ["shm"])}


def main(kind, cmd_q, res_q):
    import numpy as np

    import ferry

    provider, nics = PROVIDERS[kind]
    e = ferry.TransferEngine(provider, nics=nics, default_timeout=20)
    buf = np.zeros(SIZE, dtype=np.uint8)
    handle, desc = e.register(buf)
    msgs: queue.Queue = queue.Queue()
    e.submit_recvs(4096, 32, lambda m: msgs.put(bytes(m)))
    counters = {}
    res_q.put(("hello", e.main_address, desc, SIZE))
    while True:
        cmd = cmd_q.get()
        op = cmd[0]
        try:
            if op == "stop":
                e.stop()
                res_q.put(("ok", None))
                return
            if op == "count":
                counters[cmd[1]] = e.imm_counter(cmd[1])
                res_q.put(("ok", None))
            elif op == "wait":
                _, imm, n, timeout, off, length = cmd
                try:
                    counters[imm].wait(n, timeout)
                except ferry.Timeout as ex:
                    res_q.put(("raise", ex))
                    continue
                res_q.put(("ok", bytes(buf[off : off + length])))
            elif op == "dump":
                res_q.put(("ok", bytes(buf[cmd[1] : cmd[1] + cmd[2]])))
            elif op == "clear":
                buf[:] = 0
                res_q.put(("ok", None))
            elif op == "recv":
                _, n, timeout = cmd
                res_q.put(("ok", [msgs.get(timeout=timeout) for _ in range(n)]))
            elif op == "send":
                e.submit_send(cmd[1], cmd[2]).result(20)
                res_q.put(("ok", None))
            elif op == "write":
                _, dst, data, off, imm = cmd
                src = np.frombuffer(bytearray(data), dtype=np.uint8)
                h, _ = e.register(src)
                e.submit_write(h, 0, len(data), dst, off, imm=imm).result(20)
                e.unregister(h)
                res_q.put(("ok", None))
            elif op == "imm":
                e.submit_imm(cmd[2], cmd[1]).result(20)
                res_q.put(("ok", None))
            else:
                res_q.put(("error", f"unknown command {op!r}"))
        except Exception:
            res_q.put(("error", traceback.format_exc()))
